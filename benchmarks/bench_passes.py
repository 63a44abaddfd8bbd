"""validate's speedup under a changing load: its two batched passes timed one after the other
against side by side (runtime/generate.generate_interleaved), run by hand.

validate's speedup is the speculative pass's throughput over the target-only pass's, each over
the golden prompts at batch 16. For a demo pair (.demo/pair from `make demo`: the draft model or
the EAGLE-3 head), each round decodes the prompts (greedy, the first one left out as validate
decodes it alone) both ways: the two passes one after the other, then side by side; the speedup
of each. Loads, each for --rounds rounds: none; "on-off", two spinning processes switched on and
off at random every 0.2-1.0 s (other work starting and stopping on a shared machine); "constant",
two processes spinning throughout. Torch runs on one thread, as the thread rule gives a
validate on a busy 2-core machine. The spread of each column is what to read.

    .venv/bin/python benchmarks/bench_passes.py [--demo-dir .demo] [--method eagle3] [--golden smoke]
        [--rounds 20] [--loads none,on-off,constant]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from datetime import datetime, timezone

DRAFTERS = {"eagle3": "eagle3", "draft_model": "draft"}  # method -> its folder in the demo pair
SPINNERS = {
    "on-off": ("import random, time\nwhile True:\n    end = time.time() + random.uniform(0.2, 1.0)\n"
               "    while time.time() < end:\n        pass\n    time.sleep(random.uniform(0.2, 1.0))"),
    "constant": "while True:\n    pass",
}


def speedup(target_only, speculative) -> float:
    from specreg.runtime.metrics import aggregate

    return (aggregate([g.metrics for g in speculative])["batch_tokens_per_s"] /
            aggregate([g.metrics for g in target_only])["batch_tokens_per_s"])


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f}), "
            f"sd {statistics.pstdev(values):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", default=".demo")
    parser.add_argument("--method", choices=sorted(DRAFTERS), default="eagle3")
    parser.add_argument("--golden", default="smoke")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--loads", default="none,on-off,constant")
    args = parser.parse_args()
    os.environ["SPECREG_THREADS"] = "1"
    from specreg.runtime.process import limit_threads

    limit_threads()
    from specreg.golden_prompts.loader import load_golden_set
    from specreg.runtime.decode_config import DecodeConfig
    from specreg.runtime.generate import Pass, generate_interleaved
    from specreg.runtime.methods import load_pair
    from specreg.validators.equivalence import decode_config, encode_records

    pair = load_pair(f"{args.demo_dir}/pair/target", f"{args.demo_dir}/pair/{DRAFTERS[args.method]}",
                     method=args.method)
    settings = DecodeConfig(method=args.method, k=4)
    encoded = encode_records(load_golden_set(args.golden), pair.tokenizer, [])[1:]
    prompts = [list(ids) for _, ids in encoded]
    configs = [decode_config(record, settings, greedy=True) for record, _ in encoded]

    def passes() -> list:
        return [Pass(prompts, configs, False, {"max_rows": 16}), Pass(prompts, configs, True, {"max_rows": 16})]

    print(f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, demo {args.method} pair, golden set {args.golden} "
          f"({len(prompts)} prompts batched), 1 thread, {args.rounds} rounds per load")
    generate_interleaved(pair, passes())  # first calls' allocations, untimed
    for load in args.loads.split(","):
        spinners = ([subprocess.Popen([sys.executable, "-c", SPINNERS[load]]) for _ in range(2)]
                    if load != "none" else [])
        apart, together = [], []
        try:
            for _ in range(args.rounds):
                first, second = passes()
                apart.append(speedup(generate_interleaved(pair, [first])[0], generate_interleaved(pair, [second])[0]))
                target_only, speculative = generate_interleaved(pair, passes())
                together.append(speedup(target_only, speculative))
                if [g.token_ids for g in target_only] != [g.token_ids for g in speculative]:
                    print("  speculative tokens differ from target-only: equivalence broken")
        finally:
            for spinner in spinners:
                spinner.kill()
        print(f"load {load:8}  one after the other: {spread(apart)}  |  side by side: {spread(together)}", flush=True)


if __name__ == "__main__":
    main()
