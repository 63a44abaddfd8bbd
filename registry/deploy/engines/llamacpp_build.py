"""llama.cpp from its released source, built once and cached outside the clone.

The source is the llama.cpp that the ``llama-cpp-python`` sdist vendors (``vendor/llama.cpp``,
with tools/server and convert_hf_to_gguf.py), fetched from the package index with
``pip download --no-deps`` (specreg.core.packages). It is unpacked and built under
``$SPECREG_ENGINE_CACHE/llamacpp-<version>/`` (src/, build/) with cmake, gcc and ninja (or make):
CPU only, static, Release, ``-march=native`` (the cache is this machine's), only the targets
asked for, no web UI (its prebuilt assets would be fetched from a model hub), no OpenSSL. A
``.complete-<target>`` stamp marks each binary built; a lock file keeps two processes (two
pytest workers) from building at once. `specreg llamacpp-build` builds llama-server and prints
its path (`make llamacpp`, which .ci/run and `make demo` call).

convert(): GGUF from a Hugging Face model folder by the same source's convert_hf_to_gguf.py,
run with its own gguf-py (src/gguf-py) first on the path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

from specreg.core.packages import cache_root, distribution_file
from specreg.errors import SpecregError

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SERVER = "llama-server"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF",
                 "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF")
CONVERT_TYPES = ("f32", "bf16", "f16")


def home() -> Path:
    """The cache folder of this llama.cpp: $SPECREG_ENGINE_CACHE/llamacpp-<llama-cpp-python version>."""
    return cache_root() / f"llamacpp-{VERSION}"


@contextmanager
def build_lock(folder: Path):
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def source(log=None) -> Path:
    """vendor/llama.cpp of the sdist, unpacked once into home()/src; the vendored commit (from the
    sdist's git metadata) is written to home()/source.json."""
    folder = home()
    src = folder / "src"
    with build_lock(folder):
        if not (folder / ".complete-src").exists():
            archive = distribution_file(PACKAGE, VERSION, sdist=True)
            if log:
                log(f"unpacking llama.cpp from {archive.name}")
            shutil.rmtree(src, ignore_errors=True)
            prefix = f"llama_cpp_python-{VERSION}/"
            vendor = prefix + "vendor/llama.cpp/"
            commit = None
            with tarfile.open(archive) as sdist:
                members = []
                for member in sdist.getmembers():
                    if member.name == prefix + ".git/modules/vendor/llama.cpp/HEAD":
                        commit = sdist.extractfile(member).read().decode().strip()
                    if member.name.startswith(vendor) and member.name != vendor + ".git":
                        member.name = member.name[len(vendor):]
                        members.append(member)
                sdist.extractall(src, members=members, filter="data")
            (folder / "source.json").write_text(json.dumps({"package": f"{PACKAGE}=={VERSION}", "sdist": archive.name,
                                                            "llama_cpp_commit": commit}, indent=2))
            (folder / ".complete-src").write_text(archive.name)
    return src


def source_info() -> dict:
    """{"package", "sdist", "llama_cpp_commit"} of the unpacked source (unpacking it if needed)."""
    source()
    return json.loads((home() / "source.json").read_text())


def binary(target: str = SERVER, log=None) -> Path:
    """The path of a llama.cpp program (llama-server, llama-quantize, ...), built on first use.

    Raises SpecregError naming the missing tool or the failing step (its log file kept)."""
    folder = home()
    path = folder / "build" / "bin" / target
    stamp = folder / f".complete-{target}"
    if stamp.exists() and path.is_file():
        return path
    src = source(log)
    for tool in ("cmake", "gcc", "g++"):
        if shutil.which(tool) is None:
            raise SpecregError(f"building {target} needs {tool}, which is not on PATH")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    with build_lock(folder):
        if stamp.exists() and path.is_file():
            return path
        started = time.monotonic()
        build = folder / "build"
        jobs = str(os.cpu_count() or 2)
        for step, command in (("configure", ["cmake", "-S", str(src), "-B", str(build), *generator, *CMAKE_OPTIONS]),
                              ("build", ["cmake", "--build", str(build), "-j", jobs, "--target", target])):
            if log:
                log(f"llama.cpp {step} ({target}) in {build}")
            log_file = folder / f"{step}-{target}.log"
            with open(log_file, "w") as output:
                completed = subprocess.run(command, stdout=output, stderr=subprocess.STDOUT)
            if completed.returncode != 0:
                raise SpecregError(f"llama.cpp {step} of {target} failed (exit {completed.returncode}); see {log_file}")
        if not path.is_file():
            raise SpecregError(f"llama.cpp build wrote no {path}")
        seconds = round(time.monotonic() - started, 1)
        stamp.write_text(json.dumps({"seconds": seconds, "cpus": os.cpu_count()}))
        if log:
            log(f"built {path} in {seconds} s")
    return path


def convert(model_dir: str | Path, outfile: str | Path, outtype: str = "f32") -> Path:
    """A GGUF file of a Hugging Face model folder, written by the vendored convert_hf_to_gguf.py
    (F32 by default: the same numbers our runtime computes with). The model folder is read, never
    changed; nothing is fetched. Raises SpecregError with the converter's last line on failure."""
    if outtype not in CONVERT_TYPES:
        raise SpecregError(f"GGUF type {outtype!r}: use one of {', '.join(CONVERT_TYPES)}")
    src = source()
    outfile = Path(outfile)
    outfile.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src / "gguf-py"), str(src)]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_LOCAL_GGUF="")
    partial = outfile.with_name(f".{outfile.name}.partial")
    command = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(partial),
               "--outtype", outtype]
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (completed.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SpecregError(f"convert_hf_to_gguf.py {model_dir} failed: {last}")
    os.replace(partial, outfile)
    return outfile
