"""A command run in a real pseudo-terminal, as a person sees it: for the tests of what the CLI and
its downloads print on a terminal (progress bars, widths)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios

from clirun import SPECREG

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # cursor moves and colours tqdm and pip may write


def in_terminal(args, env: dict, columns: int = 100, program: list[str] = SPECREG) -> tuple[int, list[str]]:
    """Run ``program ARGS`` (default `specreg ARGS`) with stdin, stdout and stderr on a pty of
    `columns` columns -> (exit code, every line the terminal showed: split at newlines and
    carriage returns, escapes removed)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    process = subprocess.Popen(program + [str(a) for a in args], stdin=slave, stdout=slave, stderr=slave,
                               env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    code = process.wait(timeout=600)
    text = ESCAPES.sub("", b"".join(chunks).decode("utf-8", "replace"))
    return code, [line for line in re.split(r"\r\n|\r|\n", text) if line.strip()]


# The driver cli_chain_in_terminal runs in the pty: each command through specreg.cli.main, as
# `python -m specreg.cli` runs it, one after another in this one interpreter.
CHAIN_DRIVER = """
import json, os, sys
from specreg.cli import main
commands, workdir = json.loads(sys.argv[1]), sys.argv[2]
os.chdir(workdir)
for argv, may_fail in commands:
    sys.argv = ["specreg", *argv]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if code and not may_fail:
        print(f"CHAIN-STOPPED: exit {code} from specreg {' '.join(argv)}")
        sys.exit(code)
print("CHAIN-DONE")
"""


def cli_chain_in_terminal(script: str, env: dict, workdir, columns: int = 100) -> tuple[int, list[str]]:
    """Run the `specreg ...` lines of ``script`` (shell words; a backslash continues a line; a line
    ending in `|| true` may fail, any other failure stops the chain) one after another on a pty of
    ``columns`` columns, in ``workdir`` -> in_terminal's (exit code, lines); the last line is
    CHAIN-DONE when every command ran. All in one interpreter: a fresh one per command costs 1-3
    CPU-seconds of imports, and what reaches the terminal is the commands' own output either way
    (the pty is their stdout and stderr, its size what they read)."""
    import json
    import shlex

    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        if not line.strip():
            continue
        may_fail = line.rstrip().endswith("|| true")
        words = shlex.split(line.rstrip().removesuffix("|| true"))
        assert words[0] == "specreg", line
        commands.append((words[1:], may_fail))
    return in_terminal([json.dumps(commands), str(workdir)], env, columns,
                       program=[SPECREG[0], "-c", CHAIN_DRIVER])
