#!/usr/bin/env bash
# `make demo`: the whole chain on the embedded defaults (SQLite + local MLflow store) with the
# demo pair that specreg builds itself (no downloads). Re-runnable: the pair is cached in
# $DEMO_DIR/pair; the registry and MLflow store start fresh in $DEMO_DIR/home each time.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
export SPECREG_HOME="$DEMO_DIR/home"
export SPECREG_USER=${SPECREG_USER:-alice}
rm -rf "$SPECREG_HOME"
mkdir -p "$DEMO_DIR"

step() { printf '\n== %s\n' "$*"; }

step "build (or reuse) the demo pair"
specreg demo-pair "$DEMO_DIR/pair"

step "register the pair"
specreg register demo-chat --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/draft" \
  --num-speculative-tokens 4 --max-batch-size-for-speculation 32 --notes "demo pair built by specreg demo-pair"
specreg list
specreg show demo-chat@1

step "validate the pair on the shipped smoke golden set (HTML report + Markdown summary)"
specreg validate demo-chat@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$DEMO_DIR/validation.html" --markdown "$DEMO_DIR/validation.md"
specreg show demo-chat@1
