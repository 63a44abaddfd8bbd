#!/usr/bin/env bash
# The accelerator check of issue 11 (<= 5 min on one GPU): equivalence of every speculative
# method (draft model, EAGLE-3 chain and tree, Medusa tree, MTP) on CUDA in bf16, then the runtime
# benchmark there. For a machine whose python3 already has torch, transformers, safetensors,
# tokenizers, click, jinja2, pyyaml and jsonschema (the device image does); specreg itself is put on
# the path without its other dependencies (registry, MLflow: not needed here). Carry the demo
# pair (.demo/pair, built here by `specreg demo-pair .demo/pair --method eagle3|medusa|mtp`) so
# nothing is trained there; it is built when absent.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]     # writes gpu_check.log and bench_runtime.log
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/specreg-site . >/dev/null
export PYTHONPATH=/tmp/specreg-site PYTHONUNBUFFERED=1
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
status=0
python3 benchmarks/gpu_check.py --device cuda --dtype bfloat16 2>&1 | tee "$out/gpu_check.log" || status=1
python3 benchmarks/bench_runtime.py --device cuda --dtype bfloat16 --repeats 2 --threads 0 2>&1 \
  | tee "$out/bench_runtime.log" || status=1
exit $status
