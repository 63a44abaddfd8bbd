#!/usr/bin/env bash
# `make demo-dflash`: a DFlash block drafter for the demo target, built from the target's own
# hidden states (cached after the first run: about 1.5 CPU-minutes of training), registered with
# k from its block, shown with the target layers each engine is fed, and validated on the smoke
# set with our runtime (equivalence, distribution, acceptance, performance). Kept apart from
# `make demo` so that the main chain stays within its minutes. Its registry starts fresh each time.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
export SPECREG_HOME="$DEMO_DIR/dflash-home"
export SPECREG_USER=alice
export SPECREG_MLFLOW=off
rm -rf "$SPECREG_HOME"
mkdir -p "$DEMO_DIR"
step() { printf '\n== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

step "the demo pair and a DFlash head trained on its target's hidden states (cached in $DEMO_DIR/pair)"
specreg demo-pair "$DEMO_DIR/pair" --method dflash

step "register: k defaults to the block less its anchor; the head's target layers in each engine's numbering"
specreg register demo-chat-dflash --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/dflash" \
  --method dflash --notes "DFlash head built by specreg demo-pair --method dflash"
specreg show demo-chat-dflash@1

step "validate on the smoke golden set with our runtime"
specreg validate demo-chat-dflash@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$DEMO_DIR/validation-dflash.html"
