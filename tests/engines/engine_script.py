"""What the scripts run inside an engine's environment share (engine_check.py, engine_metrics.py,
ngram_check.py, suffix_check.py; engine_env.run_engine starts them): the CPU and offline settings
made before the engine is imported, their command line (ENGINE CASES.json OUT.json) and a
request's tokens as vLLM's model runner holds them for its proposers. A script imports this first;
it imports nothing from specreg or an engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

# The CPU platform is selected by vLLM's own switch (vllm.platforms.cpu_platform_plugin reads
# VLLM_TARGET_DEVICE): no GPU module is replaced. Nothing may reach a model hub.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def run_cases(outputs: dict[str, Callable[[list[dict]], dict]]) -> int:
    """The scripts' command line, ENGINE CASES.json OUT.json: ``outputs[ENGINE](cases)`` (one import
    of the engine for every case) written to OUT.json with the "seconds" it took; an engine the
    script does not run exits naming it."""
    engine, cases_path, out_path = sys.argv[1:4]
    if engine not in outputs:
        raise SystemExit(f"{Path(sys.argv[0]).name} runs {', '.join(outputs)}, not {engine}")
    started = time.monotonic()
    output = outputs[engine](json.loads(Path(cases_path).read_text()))
    output["seconds"] = round(time.monotonic() - started, 1)
    Path(out_path).write_text(json.dumps(output, indent=1, default=str))
    return 0


def runner_tokens(sequences: list[list[int]], max_model_len: int):
    """Requests' tokens as vLLM's model runner hands them to a proposer (its input batch) ->
    (token_ids_cpu [requests, max_model_len] int32: each row a request's tokens, then zeros;
    num_tokens_no_spec [requests] int32: each request's length)."""
    import numpy as np

    token_ids_cpu = np.zeros((len(sequences), max_model_len), dtype=np.int32)
    for row, tokens in enumerate(sequences):
        token_ids_cpu[row, :len(tokens)] = tokens
    return token_ids_cpu, np.array([len(tokens) for tokens in sequences], dtype=np.int32)
