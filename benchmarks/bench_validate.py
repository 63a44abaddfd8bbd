"""Whole-command `specreg validate` targets (run by hand on an idle machine; figures go in
docs/benchmarks.md with the date and machine):
- the real SmolLM2 pair on the default golden set: <= 2 minutes;
- the real pair on the smoke set: <= 20 s;
- the demo pair on the default golden set: <= 20 s.

Each case registers the pair in a fresh registry ($SPECREG_HOME in a temporary folder: SQLite and
the local MLflow store, mirror on as a user has it) and times `specreg validate NAME@1 --golden SET
--device cpu` as a new process: wall seconds and the CPU seconds of the process and its children.
The pairs are the ones `make demo` builds (``--demo-dir``, default .demo: pair/ and real/).

    python benchmarks/bench_validate.py [--demo-dir .demo] [--runtime-batch 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

SPECREG = str(Path(sys.executable).with_name("specreg"))
CASES = {  # name: (pair folder under --demo-dir, golden set, target seconds)
    "demo/default": ("pair", "default", 20.0),
    "real/smoke": ("real", "smoke", 20.0),
    "real/default": ("real", "default", 120.0),
}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def validate(pair_dir: Path, golden: str, batch: int) -> dict:
    """Register the pair in a fresh registry and time one validate; returns its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as home:
        env = {**os.environ, "SPECREG_HOME": home, "SPECREG_USER": "bench"}
        env.pop("SPECREG_MLFLOW", None)
        subprocess.run([SPECREG, "register", "bench", "--target", str(pair_dir / "target"),
                        "--draft", str(pair_dir / "draft"), "--num-speculative-tokens", "4"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        cpu, start = children_cpu(), time.perf_counter()
        done = subprocess.run([SPECREG, "validate", "bench@1", "--golden", golden, "--device", "cpu",
                               "--runtime-batch", str(batch), "--json"], env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode not in (0, 100):
        raise SystemExit(f"validate failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    summary = json.loads(done.stdout).get("summary") or {}
    acceptance, performance = summary.get("acceptance") or {}, summary.get("performance") or {}
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "verdict": summary.get("verdict"),
            "alpha": acceptance.get("acceptance_rate"), "tau": acceptance.get("mean_acceptance_length"),
            "speedup": performance.get("speedup"), "batch1_speedup": performance.get("batch1_speedup")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", default=".demo", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runtime-batch", type=int, default=8)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {stamp}, {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at start, "
          f"--runtime-batch {args.runtime_batch}")
    rows = []
    for case in args.cases.split(","):
        folder, golden, target = CASES[case]
        figures = validate(args.demo_dir / folder, golden, args.runtime_batch)
        rows.append({"case": case, "target_s": target, "met": figures["wall_s"] <= target, **figures})
        print(f"{case:14} {figures['wall_s']:7.1f} s wall {figures['cpu_s']:7.1f} CPU-s  target <= {target:.0f} s  "
              f"{'met' if figures['wall_s'] <= target else 'NOT met'}  {figures['verdict']} alpha {figures['alpha']} "
              f"tau {figures['tau']} speedup {figures['speedup']} (batch 1: {figures['batch1_speedup']})",
              flush=True)
    print(f"# load {os.getloadavg()[0]:.2f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"when": stamp, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
