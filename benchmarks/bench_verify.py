"""Start time of `specreg verify` (the target: under 1 s for a 2-file model, hashing excluded).

Run by hand with the interpreter of the environment to measure, e.g. the slim verify-only venv
of the README: `/tmp/slim/bin/python benchmarks/bench_verify.py`. Builds a signed lock over a
2-file model (config.json + a small model.safetensors, an ngram pair: no draft), then times the
real command in a new process, repeatedly; the two files are hashed in-process to subtract
their share. Figures go in docs/benchmarks-log.md with the date, machine and load, the latest in
docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from specreg.core.digests import sha256_file
from specreg.core.types import ModelFingerprint, ModelRef
from specreg.core.signing import create_key_pair
from specreg.registry.deploy.lock import LOCK_FILE, build_lock, lock_text, sign_lock
from specreg.registry.store.entities import PairState, PairVersion, SpecConfig, SpecMethod

SPECREG = [str(Path(sys.executable).with_name("specreg"))]
REPEATS = 9


def two_file_model(directory: Path) -> None:
    """config.json and a 1 MiB float32 safetensors file, written without torch."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 256}))
    data = os.urandom(256 * 1024 * 4)
    header = json.dumps({"w": {"dtype": "F32", "shape": [256, 1024], "data_offsets": [0, len(data)]}}).encode()
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + data)


def pair_version(target: Path) -> PairVersion:
    digest = sha256_file(target / "model.safetensors")
    fingerprint = ModelFingerprint(
        weights_sha256=digest, weight_files={"model.safetensors": digest}, weight_format="safetensors",
        config_sha256=digest, tokenizer_sha256=None, chat_template_sha256=None, architecture="LlamaForCausalLM",
        model_type="llama", vocab_size=256, tokenizer_length=None, parameter_count=256 * 1024, dtype="float32",
        max_position_embeddings=None)
    return PairVersion(id=1, name="bench", version=1, target=ModelRef(str(target), str(target), None, fingerprint),
                       draft=None, config=SpecConfig(SpecMethod.NGRAM, 3, 1, 4), binding_sha256="0" * 64,
                       state=PairState.APPROVED, registered_by="bench",
                       registered_at=datetime.now(timezone.utc).replace(tzinfo=None))


def timed(argv: list[str]) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of ``argv`` in a new process. On a
    shared machine the CPU time moves less with other jobs than the wall time does."""
    walls, cpus = [], []
    for _ in range(REPEATS):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        # cwd: not a source tree, whose specreg/ would shadow the installed package
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=tempfile.gettempdir())
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        target = root / "target"
        two_file_model(target)
        private_key, public_key = create_key_pair(root / "keys")
        lock = sign_lock(build_lock(pair_version(target), engine=None, baselines=None, approvals=[],
                                    audit_head={"event_id": None, "hash": "0" * 64}, approved=True,
                                    exported_by="bench"), private_key)
        (root / LOCK_FILE).write_text(lock_text(lock))
        start = time.perf_counter()
        for path in target.iterdir():
            sha256_file(path)
        hashing = time.perf_counter() - start
        python_s = timed([sys.executable, "-c", "pass"])
        # what verify imports of model-signing (its key verifier, without the package __init__)
        import_s = timed([sys.executable, "-c", "from specreg.core.signing import model_signing_package; "
                          "model_signing_package(); from model_signing._signing import sign_ec_key, sign_sigstore_pb"])
        # the lock carries no approver signatures here: --allow-unapproved skips that check (no keyring)
        verify_s = timed(SPECREG + ["verify", "--lock", str(root / LOCK_FILE), "--public-key", str(public_key),
                                    "--allow-unapproved", "--target", str(target)])
    start_s = verify_s[0] - hashing
    print(f"date {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}, Python {platform.python_version()}, {sys.prefix}")
    print("median of", REPEATS, "runs: wall / CPU (user + system)")
    print(f"python -c pass                   {python_s[0]:.3f} s / {python_s[1]:.3f} s")
    print(f"import model-signing's verifier  {import_s[0]:.3f} s / {import_s[1]:.3f} s")
    print(f"hashing the 2 files (in-process) {hashing:.4f} s")
    print(f"specreg verify (2-file model)    {verify_s[0]:.3f} s / {verify_s[1]:.3f} s; start without hashing "
          f"{start_s:.3f} s (target < 1 s) {'ok' if start_s < 1 else 'MISSED'}")

if __name__ == "__main__":
    main()
