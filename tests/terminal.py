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
