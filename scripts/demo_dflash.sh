#!/usr/bin/env bash
# `make demo-dflash`: a DFlash block drafter for the demo target, built from the target's own
# hidden states (cached after the first run: about 1.5 CPU-minutes of training), taken through
# the whole chain as `make demo` takes its pairs: registered with k from its block, validated by
# our runtime, validated in llama.cpp (--spec-type draft-dflash; parity, equivalence and the
# concurrency tiers), and in vLLM when `make vllm` has run, approved, promoted, exported to every
# engine that serves a block drafter, verified and gated. Kept apart from `make demo` so that the
# main chain stays within its minutes. Its registry starts fresh each time.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
export SPECREG_HOME="$DEMO_DIR/dflash-home"
export SPECREG_USER=alice
export SPECREG_MLFLOW=off
OUT="$DEMO_DIR/dflash"
rm -rf "$SPECREG_HOME" "$OUT"
mkdir -p "$OUT"
source "$(dirname "$0")/demo_common.sh"

policy_of_record "$OUT/specreg.toml" "$OUT/keys"

step "the demo pair and a DFlash head trained on its target's hidden states (cached in $DEMO_DIR/pair)"
specreg demo-pair "$DEMO_DIR/pair" --method dflash

# the engine-native layout (z-lab's DFlashDraftModel + dflash_config): the one every engine that
# serves DFlash reads, llama.cpp's converter among them (the speculators layout beside it is not)
step "register: k defaults to the block less its anchor; the head's target layers in each engine's numbering"
specreg register demo-chat-dflash --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/dflash-native" \
  --method dflash --notes "DFlash head built by specreg demo-pair --method dflash"
specreg show demo-chat-dflash@1

step "validate on the smoke golden set with our runtime"
specreg validate demo-chat-dflash@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$OUT/validation-dflash.html"

# llama.cpp's DFlash acceptance has been reported to fall with parallel slots: two tiers show it
step "the head in llama.cpp (converted by its own converter, --spec-type draft-dflash): parity, equivalence, tiers 1 and 4"
specreg llamacpp-build > /dev/null  # the binary's sha256 into this registry
specreg validate demo-chat-dflash@1 --engine llamacpp --golden smoke --concurrency 1,4

if vllm_why=$(specreg vllm-install --cached 2>&1 > /dev/null); then
  step "the head in vLLM (started here from its vllm export): parity, equivalence, tokens/s"
  rc=0; specreg validate demo-chat-dflash@1 --engine vllm --golden smoke --concurrency 1 || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 100 ] || exit "$rc"
else
  step "no vLLM here: ${vllm_why#specreg: error: } (docs/engines-vllm.md)"
fi

step "approve (bob), promote to staging and production"
specreg approve demo-chat-dflash@1 --user bob --note "DFlash head: equivalence and acceptance look right, llama.cpp agrees"
specreg promote demo-chat-dflash@1 --to staging --reason "demo rollout"
specreg promote demo-chat-dflash@1 --to production --reason "demo rollout"

step "export to the engines that serve a block drafter, with a signed lock; verify; gate"
specreg keys create --use lock --out "$OUT/keys"
specreg keys export --out "$OUT/keys/approvers.json"
for format in vllm sglang llamacpp; do
  specreg export demo-chat-dflash@production --format "$format" -o "$OUT/exports/$format" \
    --signing-key "$OUT/keys/specreg-signing.key"
done
cat "$OUT/exports/vllm/vllm-serve.sh"
specreg verify --lock "$OUT/exports/vllm/specreg.lock.json" --public-key "$OUT/keys/specreg-signing.pub" \
  --keyring "$OUT/keys/approvers.json" --config "$OUT/exports/vllm/vllm-serve.sh" \
  --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/dflash-native" \
  --registry "sqlite:///$SPECREG_HOME/registry.db" --env production
specreg gate demo-chat-dflash@production --env production

step "done"
echo "Outputs in $OUT: validation-dflash.html, exports/ (vllm, sglang, llamacpp), keys/"
