"""CLI speed targets (run by hand; figures go in docs/benchmarks-log.md with the date and machine,
the latest in docs/benchmarks.md):
- `specreg --help` under 0.3 s;
- `specreg list` with 10,000 registered versions in SQLite under 0.5 s.
Each figure is the median wall time of repeated runs of the real command in a new process.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from specreg.core.types import ModelFingerprint, ModelRef
from specreg.registry.store.entities import SpecConfig, SpecMethod
from specreg.registry.store.store import Store

SPECREG = [str(Path(sys.executable).with_name("specreg"))]
VERSIONS = 10_000
REPEATS = 7


def fake_ref(index: int) -> ModelRef:
    digest = f"{index:064x}"
    fingerprint = ModelFingerprint(
        weights_sha256=digest, weight_files={"model.safetensors": digest}, weight_format="safetensors",
        config_sha256=digest, tokenizer_sha256=digest, chat_template_sha256=digest, architecture="LlamaForCausalLM",
        model_type="llama", vocab_size=32000, tokenizer_length=32000, parameter_count=10**9, dtype="bfloat16",
        max_position_embeddings=4096)
    return ModelRef(reference=f"/models/m{index}", path=f"/models/m{index}", revision=None, fingerprint=fingerprint)


def seed(url: str) -> None:
    """10,000 versions over 100 pairs, written through the store (audit chain included)."""
    store = Store(url)
    config = SpecConfig(SpecMethod.DRAFT_MODEL, 4)
    for index in range(VERSIONS):
        store.create_version(name=f"pair-{index % 100:03d}", target=fake_ref(index), draft=fake_ref(index + VERSIONS),
                             config=config, binding_sha256=f"{index:064x}", actor="bench", notes=None,
                             allow_pickle=False)


def timed(args: list[str], env: dict[str, str]) -> float:
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(SPECREG + args, env=env, check=True, stdout=subprocess.DEVNULL)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SPECREG_HOME": home}
        url = f"sqlite:///{Path(home) / 'registry.db'}"
        start = time.perf_counter()
        seed(url)
        seeded = time.perf_counter() - start
        help_s = timed(["--help"], env)
        list_s = timed(["list"], env)
        list_json_s = timed(["list", "--json"], env)
    print(f"date {datetime.now(timezone.utc):%Y-%m-%d}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"seeded {VERSIONS} versions in {seeded:.1f} s")
    print(f"specreg --help            {help_s:.3f} s  (target < 0.3 s)  {'ok' if help_s < 0.3 else 'MISSED'}")
    print(f"specreg list (10k)        {list_s:.3f} s  (target < 0.5 s)  {'ok' if list_s < 0.5 else 'MISSED'}")
    print(f"specreg list --json (10k) {list_json_s:.3f} s")


if __name__ == "__main__":
    main()
