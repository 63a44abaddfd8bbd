#!/usr/bin/env bash
# The whole `specreg validate` as a user runs it, on a device (run by gpu_check.sh after
# gpu_check.py has built the demo pair and heads; by hand on a CPU to try it): a fresh SQLite
# registry in a temporary folder, every check on the device in DTYPE (the memory check against the
# device's own memory, the performance check's timings, the tree depth's verification cost), for
# the demo pair (draft model, k=4) and the demo Medusa heads with the demo tree. MLflow is not
# needed: without it validate records the run in the registry and says there is no mirror.
# Exit 1 when a command fails or a check fails (validate's exit 100).
#
#   bash benchmarks/gpu_validate.sh [DEVICE (cuda)] [DTYPE (bfloat16)] [DEMO_DIR (.demo/pair)]
set -euo pipefail
cd "$(dirname "$0")/.."
device=${1:-cuda} dtype=${2:-bfloat16} demo=$(realpath "${3:-.demo/pair}")
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
# out of the checkout: its specreg/ folder is not the installed package (pyproject maps the
# top-level folders into it), and `python3 -m`/`-c` put the working directory first on the path
cd "$home"
# the specreg on PYTHONPATH (gpu_check.sh installs it there; a venv's own otherwise)
specreg() { SPECREG_HOME="$home" SPECREG_MLFLOW=off SPECREG_USER=gpu-check python3 -m specreg.cli "$@"; }
tree=$(python3 -c "import json; from specreg.builders.demo_medusa import DEMO_TREE; print(json.dumps(DEMO_TREE))")
specreg register gpu-draft --target "$demo/target" --draft "$demo/draft" --num-speculative-tokens 4
specreg validate gpu-draft@1 --golden smoke --device "$device" --dtype "$dtype"
specreg register gpu-medusa --target "$demo/target" --draft "$demo/medusa" --method medusa --tree "$tree"
specreg validate gpu-medusa@1 --golden smoke --device "$device" --dtype "$dtype"
specreg show gpu-medusa@1
