#!/usr/bin/env bash
# The accelerator check (<= 6 min on one GPU): equivalence and the distribution check of every
# speculative method (draft model, EAGLE-3 chain and tree, Medusa tree, MTP) on CUDA in bf16
# (gpu_check.py); the whole `specreg validate` on the demo pair and the demo Medusa tree
# (gpu_validate.sh: a fresh SQLite registry, every check on the device); then the runtime
# benchmarks: bench_batch.py measures tokens/s per batch size against batch 1 on the demo pair and
# the demo target's heads (BATCH_SIZES, default 1,2,4,8,16,32) and checks each batch token for
# token. BATCH_SIZES, PROMPTS (32) and MAX_NEW_TOKENS (64) size that last part.
#
# For a machine whose python3 already has torch, transformers, safetensors, tokenizers, click,
# jinja2 and pyyaml, with the rest on PYTHONPATH where it is missing (the device image lacks
# jsonschema, SQLAlchemy and alembic: carry the wheels of jsonschema, referencing,
# jsonschema-specifications, rpds-py, sqlalchemy, alembic and mako). specreg itself is put on the
# path without its other dependencies (MLflow and the signing libraries: validate runs without
# them, with no MLflow mirror). The demo pair (.demo/pair) is built there, or reused when carried
# and built with the same torch, transformers and tokenizers (its build key names them; the device
# image's differ from ours, so it is rebuilt there, the pair in 16 s).
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]   # gpu_check.log, validate.log, bench_runtime.log, bench_batch.log/.json
#
# DEVICE=cpu runs the same on a CPU, DEMO_DIR (default .demo/pair) says where the demo pair and
# heads are built: a rehearsal under the GPU image's own torch and transformers (PyPI's torch
# 2.11.0 runs on a CPU too) in a venv of its own, without overwriting the checkout's demo pair.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-.}}
mkdir -p "$out"
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target /tmp/specreg-site . >/dev/null
# a PYTHONPATH already set (wheels carried for packages the image lacks) stays behind ours
export PYTHONPATH=/tmp/specreg-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
device=${DEVICE:-cuda} demo=${DEMO_DIR:-.demo/pair}
if [[ $device == cuda* ]]; then
  python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
fi
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
status=0
python3 benchmarks/gpu_check.py --dir "$demo" --device "$device" --dtype bfloat16 2>&1 | tee "$out/gpu_check.log" || status=1
bash benchmarks/gpu_validate.sh "$device" bfloat16 "$demo" 2>&1 | tee "$out/validate.log" || status=1
python3 benchmarks/bench_runtime.py --dir "$demo" --device "$device" --dtype bfloat16 --repeats 2 --threads 0 2>&1 \
  | tee "$out/bench_runtime.log" || status=1
python3 benchmarks/bench_batch.py --pairs demo,demo-eagle3,demo-eagle3-tree,demo-mtp,demo-medusa --demo-dir "$demo" \
  --device "$device" --dtype bfloat16 --threads 0 \
  --batch-sizes "${BATCH_SIZES:-1,2,4,8,16,32}" --prompts "${PROMPTS:-32}" --max-new-tokens "${MAX_NEW_TOKENS:-64}" --json "$out/bench_batch.json" 2>&1 \
  | tee "$out/bench_batch.log" || status=1
exit $status
