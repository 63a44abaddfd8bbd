"""llama.cpp from its released source, built once and cached outside the clone.

The source is the llama.cpp that the ``llama-cpp-python`` sdist vendors (``vendor/llama.cpp``,
with tools/server and convert_hf_to_gguf.py), fetched from the package index with
``pip download --no-deps`` (specreg.core.packages). It is unpacked and built under
``$SPECREG_ENGINE_CACHE/llamacpp-<version>/`` (src/, build/) with cmake, gcc and ninja (or make):
CPU only, static, Release, ``-march=native`` (the cache is this machine's), only the targets
asked for, no web UI (its prebuilt assets would be fetched from a model hub), no OpenSSL. A
``.complete-<target>`` stamp marks each binary built; a lock file keeps two processes (two
pytest workers) from building at once. Cache folders are made 0755 whatever the umask.

Trust is the registry's, not the cache's (registry/store/engine_artifacts.py): `specreg
llamacpp-build` builds llama-server, records its sha256 in the registry in use and prints its
path (`make llamacpp`, which .ci/run and `make demo` call); trusted_server() hashes the binary
before every start and refuses one whose digest the registry has no record of, naming that
command. A binary changed since its build (its stamp records the digest built) is built again
by `specreg llamacpp-build`, never recorded.

convert(): GGUF from a Hugging Face model folder by the same source's convert_hf_to_gguf.py,
run with its own gguf-py (src/gguf-py) first on the path. converted(): the same, once per model
content: kept under home()/gguf by the model's registered fingerprint, the GGUF type and this
llama.cpp, its sha256 recorded in the registry; re-hashed on every reuse, and a file whose digest
the registry has no record of for that model (swapped, edited, or made for another registry) is
converted again, never served or bound into a lock. `validate --engine llamacpp` and the
llamacpp export take their files from there, so a pair is converted once, not by every
validation and every export.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from contextlib import contextmanager
from pathlib import Path

from specreg.core.packages import cache_dir, cache_root, distribution_file
from specreg.errors import SpecregError

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
SERVER = "llama-server"
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                 "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                 "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF",
                 "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF")
CONVERT_TYPES = ("f32", "bf16", "f16")
SERVER_KEY = f"{PACKAGE}=={VERSION} {SERVER}"  # what a recorded llama-server digest was built from
BUILD_COMMAND = "specreg llamacpp-build"


def home() -> Path:
    """The cache folder of this llama.cpp: $SPECREG_ENGINE_CACHE/llamacpp-<llama-cpp-python version>."""
    return cache_root() / f"llamacpp-{VERSION}"


@contextmanager
def build_lock(folder: Path):
    import fcntl

    cache_dir(folder)
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


def binary(target: str = SERVER, log=None, progress=None) -> Path:
    """The path of a llama.cpp program (llama-server, llama-quantize, ...), built on first use.
    ``progress(what, done, total)`` follows the build's compile steps (ninja's [N/M], make's %).

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
            returncode = run_logged(command, log_file, progress if step == "build" else None,
                                    f"building {target}")
            if returncode != 0:
                raise SpecregError(f"llama.cpp {step} of {target} failed (exit {returncode}); see {log_file}")
        if not path.is_file():
            raise SpecregError(f"llama.cpp build wrote no {path}")
        seconds = round(time.monotonic() - started, 1)
        for made in (build, build / "bin"):  # cmake made them under the caller's umask
            os.chmod(made, 0o755)
        os.chmod(path, 0o755)
        stamp.write_text(json.dumps({"seconds": seconds, "cpus": os.cpu_count(), "sha256": sha256_of(path)}))
        if log:
            log(f"built {path} in {seconds} s")
    return path


def sha256_of(path: Path) -> str:
    from specreg.core.digests import sha256_file

    return sha256_file(path)


def build_and_record(records, log=None, progress=None) -> Path:
    """`specreg llamacpp-build`: llama-server built (binary()) and its sha256 recorded in the
    registry of ``records`` (registry.store.engine_artifacts.ArtifactRecords) -> its path. A cached
    binary that is no longer the one its build stamped is built again first, never recorded."""
    path = binary(SERVER, log=log, progress=progress)
    stamp = home() / f".complete-{SERVER}"
    try:
        built = json.loads(stamp.read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        built = None
    digest = sha256_of(path)
    if built is not None and digest != built:
        if log:
            log(f"{path}: no longer the binary built here (sha256 {digest[:12]}, built {built[:12]}); building again")
        stamp.unlink(missing_ok=True)
        path = binary(SERVER, log=log, progress=progress)
        digest = sha256_of(path)
    records.record("llama-server", SERVER_KEY, digest, str(path))
    return path


def trusted_server(records, log=None) -> tuple[Path, str]:
    """(llama-server's path, its sha256) once its digest is one the registry of ``records``
    recorded when it was built; SpecregError (one line, naming the command that records it)
    for a binary missing or unknown to the registry: it is never executed then."""
    path = home() / "build" / "bin" / SERVER
    if not (home() / f".complete-{SERVER}").exists() or not path.is_file():
        raise SpecregError(f"llama-server is not built in {home()}: run `{BUILD_COMMAND}` (with this --db) first")
    digest = sha256_of(path)
    if digest not in records.digests("llama-server", SERVER_KEY):
        raise SpecregError(f"{path} (sha256 {digest[:16]}) is not a llama-server this registry recorded as built: "
                           f"not run; `{BUILD_COMMAND}` with this --db builds and records it")
    if log:
        log(f"{path}: sha256 {digest[:16]} as recorded in the registry")
    return path, digest


def gguf_cache() -> Path:
    """Where converted() keeps its GGUF files: home()/gguf."""
    return home() / "gguf"


BUILD_STEP = re.compile(r"^\[(\d+)/(\d+)\] ")  # ninja: [12/345] Building CXX object ...
MAKE_STEP = re.compile(r"^\[\s*(\d+)%\] ")  # make: [ 45%] Building CXX object ...


def run_logged(command: list[str], log_file: Path, progress, what: str) -> int:
    """Run ``command`` with its output in ``log_file``, reporting ``progress(what, done, total)``
    from the build tool's step counter as lines arrive -> its exit code."""
    with open(log_file, "w") as output:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace")
        for line in process.stdout:
            output.write(line)
            if progress is None:
                continue
            step = BUILD_STEP.match(line)
            if step:
                progress(what, int(step.group(1)), int(step.group(2)))
            elif percent := MAKE_STEP.match(line):
                progress(what, int(percent.group(1)), 100)
        return process.wait()


def converted(model_dir: str | Path, fingerprint, outtype: str = "f32", log=None, *, records,
              target: tuple[str | Path, object] | None = None,
              config_updates: dict | None = None) -> tuple[Path, str]:
    """(cached GGUF of the model folder, its sha256): ``fingerprint`` is the folder's registered
    ModelFingerprint, which the caller has checked against the folder (nothing here re-reads the
    model). ``target`` (an EAGLE-3 head's target: its folder and registered fingerprint) is passed
    to the converter as --target-model-dir, and its fingerprint joins the key: the head's GGUF embeds
    the target's vocabulary, hidden size and layer count. ``config_updates``: keys the converter is
    shown in the model's config.json on top of the file's own (convert()); they join the key too.
    The cache entry is keyed by those fingerprints, ``outtype`` and this llama.cpp; its digest is
    recorded in the registry of ``records`` (registry.store.engine_artifacts), and on reuse the file
    is hashed again and converted anew unless that digest is recorded there."""
    from specreg.core.digests import sha256_file

    identity = {"fingerprint": fingerprint.to_dict(), "outtype": outtype, "llama_cpp": VERSION}
    if target is not None:
        identity["target_fingerprint"] = target[1].to_dict()
    if config_updates:
        identity["config_updates"] = config_updates
    identity = json.dumps(identity, sort_keys=True)
    key = hashlib.sha256(identity.encode()).hexdigest()[:24]
    folder = gguf_cache()
    path = folder / f"{key}-{outtype}.gguf"
    record_key = f"{key}-{outtype}"
    with build_lock(folder):  # two processes converting one model: the second one waits and reuses
        if path.is_file():
            digest = sha256_file(path)
            if digest in records.digests("gguf", record_key):
                return path, digest
            if log:
                log(f"{path}: sha256 {digest[:12]} is not a conversion this registry recorded; converting again")
        if log:
            log(f"converting {model_dir} to GGUF {outtype} with llama.cpp's convert_hf_to_gguf.py into {folder}")
        convert(model_dir, path, outtype, target_model_dir=target[0] if target is not None else None,
                config_updates=config_updates)
        os.chmod(path, 0o644)
        digest = sha256_file(path)
        records.record("gguf", record_key, digest, str(path))
    return path, digest


def stage_config(model_dir: str | Path, staged: Path, config_updates: dict) -> Path:
    """``staged``: the files of ``model_dir`` linked (never copied), its config.json rewritten with
    ``config_updates`` at the top level -> ``staged``."""
    source_dir = Path(model_dir).resolve()
    staged.mkdir(parents=True)
    for entry in source_dir.iterdir():
        if entry.name != "config.json":
            os.symlink(entry, staged / entry.name)
    try:
        config = json.loads((source_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SpecregError(f"{source_dir / 'config.json'}: cannot read it ({exc})") from None
    (staged / "config.json").write_text(json.dumps({**config, **config_updates}, indent=2), encoding="utf-8")
    return staged


def gguf_package():
    """gguf-py, the reader of the GGUF files convert_hf_to_gguf.py writes: the installed one, else
    the copy beside the converter in the unpacked source (src/gguf-py)."""
    try:
        import gguf
    except ImportError:
        sys.path.insert(0, str(source() / "gguf-py"))
        import gguf
    return gguf


def gguf_values(path: Path, where: str) -> list:
    """What llama-server reads of a draft GGUF, through gguf-py (read_back.ReadValues): its
    general.architecture (eagle3: --spec-type draft-eagle3 runs it as an EAGLE-3 head), the target
    layer inputs eagle3.target_layers in their order (the order their states are concatenated into
    fc) and the d2t tensor (absolute target ids, conversion/llama.py:338-351)."""
    from specreg.registry.deploy.read_back import ReadValue, vocab_map

    gguf = gguf_package()
    try:
        reader = gguf.GGUFReader(path)
        fields = reader.fields
        architecture = bytes(fields["general.architecture"].parts[-1]).decode()
    except (OSError, ValueError, KeyError) as exc:
        raise SpecregError(f"{where}: not a GGUF file gguf-py reads ({exc})") from None
    read = [ReadValue("method", "eagle3" if architecture == "eagle3" else "draft_model",
                      f"{where} general.architecture {architecture!r}")]
    if architecture != "eagle3":
        return read
    layers = fields.get("eagle3.target_layers")
    ids = [int(layers.parts[i][0]) for i in layers.data] if layers is not None else None
    read.append(ReadValue("aux_layers", ids, f"{where} eagle3.target_layers"))
    d2t = next((tensor for tensor in reader.tensors if tensor.name == "d2t"), None)
    read.append(ReadValue("vocab_map", vocab_map(d2t.data.reshape(-1).tolist() if d2t is not None else None),
                          f"{where} d2t"))
    return read


# conversion/base.py get_vocab_base_pre: a BPE tokenizer is recognised by the sha256 of the ids it
# gives a fixed text; an unknown one raises NotImplementedError after a warning naming that hash
UNKNOWN_PRE_TOKENIZER = "BPE pre-tokenizer was not recognized"
PRE_TOKENIZER_HASH = re.compile(r"\*\* chkhsh:\s+([0-9a-f]{64})")


def convert(model_dir: str | Path, outfile: str | Path, outtype: str = "f32",
            target_model_dir: str | Path | None = None, config_updates: dict | None = None) -> Path:
    """A GGUF file of a Hugging Face model folder, written by the vendored convert_hf_to_gguf.py
    (F32 by default: the same numbers our runtime computes with). ``target_model_dir``: the
    target an EAGLE-3 head drafts for (the converter reads its config and tokenizer).
    ``config_updates``: top-level keys set in the config.json the converter reads, on a staged
    copy of the folder (its other files linked), e.g. an EAGLE-3 head's aux ids, which the converter
    reads from the top level only (conversion/llama.py:74-81). The folders are read, never
    changed; nothing is fetched. Raises SpecregError with one line: the tokenizer llama.cpp cannot
    pre-tokenize, or the converter's last line on any other failure."""
    import tempfile

    if outtype not in CONVERT_TYPES:
        raise SpecregError(f"GGUF type {outtype!r}: use one of {', '.join(CONVERT_TYPES)}")
    src = source()
    outfile = Path(outfile)
    cache_dir(outfile.parent)
    if config_updates:
        with tempfile.TemporaryDirectory(prefix="specreg-convert-") as staging:
            staged = stage_config(model_dir, Path(staging) / "model", config_updates)
            return convert(staged, outfile, outtype, target_model_dir=target_model_dir)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src / "gguf-py"), str(src)]),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", NO_LOCAL_GGUF="")
    partial = outfile.with_name(f".{outfile.name}.partial")
    command = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(partial),
               "--outtype", outtype]
    if target_model_dir is not None:
        command += ["--target-model-dir", str(target_model_dir)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    if completed.returncode != 0:
        partial.unlink(missing_ok=True)
        if UNKNOWN_PRE_TOKENIZER in completed.stderr:
            found = PRE_TOKENIZER_HASH.search(completed.stderr)
            tokenizer_dir = target_model_dir or model_dir
            raise SpecregError(
                f"{Path(tokenizer_dir) / 'tokenizer.json'}: llama.cpp cannot pre-tokenize this tokenizer: its BPE "
                f"pre-tokenizer (hash {found.group(1)[:12] if found else 'unknown'}) is in none of "
                f"convert_hf_to_gguf.py's tables (conversion/base.py:1940-1953 get_vocab_base_pre), so llama-server "
                f"would split text otherwise than the model's own tokenizer; serve it with a tokenizer llama.cpp "
                f"knows (a released model's, or Llama 2's byte-fallback layout)")
        lines = [line for line in completed.stderr.strip().splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if "Error" in line or "error" in line), None) \
            or (lines or ["(no output)"])[-1]
        raise SpecregError(f"convert_hf_to_gguf.py {model_dir} failed: {last.strip()}")
    os.replace(partial, outfile)
    return outfile
