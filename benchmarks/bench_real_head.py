"""The real EAGLE-3 head (SmolLM2-135M-Instruct's, builders/real_head.py) in llama.cpp: tokens/s with
and without the head at concurrency 1 and 2, and acceptance (α) and τ in the engine and in our
runtime, on a golden set.

Run by hand once the head is built (`specreg demo-pair DIR --real --method eagle3`):

    python benchmarks/bench_real_head.py DIR [--golden smoke] [--threads N] [--json OUT]

It registers the pair in a throwaway SQLite registry and measures with the commands users run:
`specreg validate` (our runtime) and `specreg validate --engine llamacpp --concurrency 1,2`
(llama-server with `--spec-type draft-eagle3` and without a draft, same GGUFs, each tier on one
`-np 2` server). Figures go in docs/llamacpp-heads.md and the README with the date, machine and
load (the machine's 1-minute load average is printed before and after: a busy machine's tokens/s
are not figures to publish).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

SPECREG = [str(Path(sys.executable).with_name("specreg"))]


def specreg(args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run(SPECREG + args, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 100):  # 100: ran, a check failed (still figures)
        sys.exit(f"specreg {' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout) if "--json" in args else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where `specreg demo-pair DIR --real --method eagle3` built")
    parser.add_argument("--golden", default="smoke")
    parser.add_argument("--threads", type=int, default=1, help="llama-server threads per server")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    head, target = options.directory / "eagle3", options.directory / "target"
    if not (head / "config.json").is_file():
        sys.exit(f"{head}: no head; build it with `specreg demo-pair {options.directory} --real --method eagle3`")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-real-head-") as scratch:
        env = {**os.environ, "SPECREG_HOME": scratch, "SPECREG_USER": "bench", "SPECREG_MLFLOW": "off"}
        db = ["--db", f"sqlite:///{scratch}/registry.db"]
        specreg(["register", "smollm2-eagle3", "--target", str(target), "--draft", str(head), "--method", "eagle3",
                 "--num-speculative-tokens", "4", *db], env)
        ours = specreg(["validate", "smollm2-eagle3@1", "--golden", options.golden, "--device", "cpu", "--json", *db],
                       env)
        subprocess.run(SPECREG + ["llamacpp-build", *db], env=env, capture_output=True, check=True)
        engine = specreg(["validate", "smollm2-eagle3@1", "--engine", "llamacpp", "--golden", options.golden,
                          "--concurrency", "1,2", "--engine-threads", str(options.threads), "--json", *db], env)
    report = engine["report"]
    parity = {check["name"]: check for check in report["checks"]}["engine_parity"]["figures"]
    figures = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": platform.node(),
        "cores": os.cpu_count(), "load_1min_before": round(load_before, 2), "load_1min_after": round(os.getloadavg()[0], 2),
        "golden": options.golden, "k": 4, "llama_server_threads": options.threads,
        "alpha_ours": parity.get("alpha_ours"), "tau_ours": parity.get("tau_ours"),
        "alpha_llamacpp": parity.get("alpha_engine"), "tau_llamacpp": parity.get("tau_engine"),
        "validation_status": ours.get("status") or ours.get("run", {}).get("status"),
        "tiers": [{"concurrency": tier["concurrency"], "with_head_tokens_per_s": tier["with_draft_tokens_per_s"],
                   "without_tokens_per_s": tier["without_draft_tokens_per_s"],
                   "speedup": tier["with_draft_tokens_per_s"] / tier["without_draft_tokens_per_s"],
                   "alpha": tier.get("acceptance_rate")} for tier in report["throughput"]],
        "command": report["command"],
    }
    print(f"{figures['date']} on {figures['machine']} ({figures['cores']} cores, load {load_before:.1f} -> "
          f"{figures['load_1min_after']:.1f}), golden set {options.golden}, k 4")
    shown = {key: "-" if figures[key] is None else f"{figures[key]:.3f}"
             for key in ("alpha_ours", "alpha_llamacpp", "tau_ours", "tau_llamacpp")}
    print(f"alpha: ours {shown['alpha_ours']}, llama.cpp {shown['alpha_llamacpp']}; "
          f"tau: ours {shown['tau_ours']}, llama.cpp {shown['tau_llamacpp']}")
    print("concurrency | with head tok/s | without tok/s | speedup | alpha")
    for tier in figures["tiers"]:
        print(f"{tier['concurrency']:>11} | {tier['with_head_tokens_per_s']:>15.1f} | {tier['without_tokens_per_s']:>13.1f}"
              f" | {tier['speedup']:>7.2f} | {tier['alpha'] if tier['alpha'] is None else round(tier['alpha'], 3)}")
    if options.json:
        options.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
