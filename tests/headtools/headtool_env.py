"""The training tools whose heads the tests of this folder register and validate: speculators
0.9.0 (vLLM's) and nvidia-modelopt 0.47.0 (NVIDIA's), both of which build EAGLE-3 heads on a CPU.

On first use each wheel is fetched with ``pip download --no-deps`` into the engine cache's wheel
folder (specreg.core.packages.distribution_file), and both are installed with ``pip install
--no-deps --target`` into one folder beside the packages of headtools-deps.txt (what they import
that the test venv lacks; torch and transformers are the venv's). The folder lives under
$SPECREG_ENGINE_CACHE (default /var/cache/specreg/engines), keyed by the deps file's content: a
second run reuses it. Without the package index the tests skip, unless CI=true, where a missing
tool is a failure (as tests/engines/engine_env.py does for the engines).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

from specreg.core.packages import PackageUnavailable, cache_root, distribution_file, run_pip

HERE = Path(__file__).parent
TOOLS = {"speculators": "0.9.0", "nvidia-modelopt": "0.47.0"}
DEPS = HERE / "headtools-deps.txt"
BUILD_SCRIPT = HERE / "build_tool_heads.py"


class ToolUnavailable(Exception):
    """A tool could not be fetched or installed (no package index)."""


def prepare_tools(log=lambda line: print(line, file=sys.stderr, flush=True)) -> Path:
    """The folder holding both tools and their import dependencies (installed on first use)."""
    key = hashlib.sha256((DEPS.read_text() + repr(sorted(TOOLS.items()))).encode()).hexdigest()[:12]
    folder = cache_root() / f"headtools-{key}"
    if (folder / ".complete").exists():
        return folder
    started = time.monotonic()
    log(f"[headtools] speculators and nvidia-modelopt wheels and {DEPS.name} into {folder}")
    try:
        wheels = [str(distribution_file(name, version, quiet=True)) for name, version in TOOLS.items()]
        run_pip(["install", "--no-deps", "--target", str(folder), *wheels, "-r", str(DEPS)], "pip install head tools")
    except PackageUnavailable as exc:
        raise ToolUnavailable(str(exc)) from None
    (folder / ".complete").write_text(DEPS.read_text())
    log(f"[headtools] installed in {time.monotonic() - started:.0f} s")
    return folder
