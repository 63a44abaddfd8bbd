"""Generate templates/engines/vllm-0.33.json and sglang-0.5.23.json from the engines' released code.

Usage: .venv/bin/python scripts/engine_schemas.py [vllm] [sglang]

Each engine wheel is fetched and unpacked into the test cache (tests/engines/engine_env.py,
the same cache the engine tests use) and its own parser and config classes are read by
tests/engines/engine_check.py: vLLM's `vllm serve` parser and SpeculativeConfig /
SpeculativeMethod, SGLang's ServerArgs.add_cli_args. The tests
tests/engines/test_engine_exports.py and test_sglang_exports.py::test_schema_file_is_generated_from_the_engine
fail when the committed files differ from what this writes.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "engines"))

from engine_env import run_engine  # noqa: E402

FILES = {"vllm": "vllm-0.33.json", "sglang": "sglang-0.5.23.json"}


def main(engines: list[str]) -> int:
    for engine in engines or list(FILES):
        with tempfile.TemporaryDirectory() as workdir:
            schema = run_engine(engine, [], Path(workdir))["schema"]
        path = REPO / "templates" / "engines" / FILES[engine]
        path.write_text(json.dumps(schema, indent=2) + "\n")
        print(f"wrote {path.relative_to(REPO)}: {len(schema['flags'])} flags")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
