"""Whole-command `specreg validate` targets (run by hand on an idle machine; figures go in
docs/benchmarks-log.md with the date and machine, the latest in docs/benchmarks.md):
- the real SmolLM2 pair on the default golden set: <= 2 minutes;
- the real pair on the smoke set: <= 20 s;
- the demo pair on the default golden set: <= 20 s.

Each case registers the pair in a fresh registry ($SPECREG_HOME in a temporary folder: SQLite and
the local MLflow store, mirror on as a user has it) and times `specreg validate NAME@1 --golden SET
--device cpu` as a new process: wall seconds and the CPU seconds of the process and its children,
and the torch threads validate ran on (it takes the cores other work leaves free). Before each
case it waits (up to --settle seconds) until the CPUs' counters show less than 0.3 of a core busy
over a second (runtime/process.busy_now): timings from an idle machine only. The
machine's speed drifts (the same forward took 37 and 42 ms an hour apart on the 2-core VM): a
calibration figure, one float32 matrix product timed before and after, goes with the results.
The pairs are the ones `make demo` builds (``--demo-dir``, default .demo: pair/ and real/).

    python benchmarks/bench_validate.py [--demo-dir .demo] [--runtime-batch N] [--settle 120] [--json FILE]
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


def calibration_ms() -> float:
    """Milliseconds of one 1024x1024 float32 matrix product on one thread (median of 9): how fast
    this machine is right now."""
    code = ("import time, torch; torch.set_num_threads(1); a = torch.randn(1024, 1024); a @ a\n"
            "t = []\nfor _ in range(9):\n s = time.perf_counter(); a @ a; t.append(time.perf_counter() - s)\n"
            "print(sorted(t)[4] * 1000)")
    return round(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout), 2)


def settle(limit_s: float) -> float:
    """Wait until other work holds less than 0.3 of a core (at most limit_s) -> the busy cores then."""
    from specreg.runtime.process import busy_now

    deadline = time.monotonic() + limit_s
    while True:
        busy = busy_now(window=1.0)
        if busy is None or busy < 0.3 or time.monotonic() >= deadline:
            return busy if busy is not None else os.getloadavg()[0]


def validate(pair_dir: Path, golden: str, batch: int | None) -> dict:
    """Register the pair in a fresh registry and time one validate; returns its figures."""
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as home:
        env = {**os.environ, "SPECREG_HOME": home, "SPECREG_USER": "bench"}
        env.pop("SPECREG_MLFLOW", None)
        subprocess.run([SPECREG, "register", "bench", "--target", str(pair_dir / "target"),
                        "--draft", str(pair_dir / "draft"), "--num-speculative-tokens", "4"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        batch_flag = ["--runtime-batch", str(batch)] if batch is not None else []
        cpu, start = children_cpu(), time.perf_counter()
        done = subprocess.run([SPECREG, "validate", "bench@1", "--golden", golden, "--device", "cpu", *batch_flag,
                               "--json"], env=env, capture_output=True, text=True)
        wall, cpu = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode not in (0, 100):
        raise SystemExit(f"validate failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    record = json.loads(done.stdout)
    summary = record.get("summary") or {}
    acceptance, performance = summary.get("acceptance") or {}, summary.get("performance") or {}
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "verdict": summary.get("verdict"),
            "threads": (record.get("environment") or {}).get("threads"),
            "runtime_batch": (record.get("options") or {}).get("runtime_batch_size"),
            "alpha": acceptance.get("acceptance_rate"), "tau": acceptance.get("mean_acceptance_length"),
            "speedup": performance.get("speedup"), "batch1_speedup": performance.get("batch1_speedup")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", default=".demo", type=Path)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runtime-batch", type=int, default=None, help="default: validate's own")
    parser.add_argument("--settle", type=float, default=120.0, metavar="SECONDS",
                        help="wait up to this long before each case for the CPUs to fall below 0.3 of a core busy")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    calibration = [calibration_ms()]
    print(f"# {stamp}, {platform.machine()}, {os.cpu_count()} cores, calibration {calibration[0]} ms "
          f"(1024^3 float32 matmul, 1 thread)")
    rows = []
    for case in args.cases.split(","):
        folder, golden, target = CASES[case]
        busy = settle(args.settle)
        figures = validate(args.demo_dir / folder, golden, args.runtime_batch)
        rows.append({"case": case, "target_s": target, "met": figures["wall_s"] <= target, "busy_cores_before": round(busy, 2),
                     **figures})
        print(f"{case:14} {figures['wall_s']:7.1f} s wall {figures['cpu_s']:7.1f} CPU-s  target <= {target:.0f} s  "
              f"{'met' if figures['wall_s'] <= target else 'NOT met'}  (other work {busy:.2f} cores, {figures['threads']} threads, "
              f"batch {figures['runtime_batch']})  {figures['verdict']} alpha {figures['alpha']:.4f} "
              f"tau {figures['tau']:.3f} speedup {figures['speedup']:.3f} (batch 1: {figures['batch1_speedup']:.3f})",
              flush=True)
    calibration.append(calibration_ms())
    print(f"# calibration {calibration[1]} ms at the end")
    if args.json:
        Path(args.json).write_text(json.dumps({"when": stamp, "calibration_ms": calibration, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
