"""`specreg ARGS` run inside the test process: the same entry point (``specreg.cli.main``) with
its argv, environment, working directory and standard streams, returned as the
``subprocess.CompletedProcess`` that a real ``python -m specreg.cli`` run would give.

Why: a fresh interpreter per CLI call costs ~1 s of imports (SQLAlchemy, click, the registry)
on this 2-core machine, and the suite makes a few hundred such calls. What the CLI tests check
(exit codes, one-line errors, stdout/JSON, files and database rows) is the work of ``main`` and
the commands, which run here unchanged; an uncaught exception is printed as Python prints it
(``Traceback (most recent call last):`` on stderr, exit 1), so "no traceback" assertions still
bite. A few tests per area keep a real subprocess (``SPECREG`` argv) for what only a process
shows: the ``python -m`` entry, signals, import-time cost, interpreter warnings.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout

SPECREG = [sys.executable, "-m", "specreg.cli"]  # the real process, for the tests that need one


def run_specreg(args, *, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """Run ``specreg *args`` in this process.

    ``env``: the whole environment of the call, as for ``subprocess.run`` (default: this
    process's); ``cwd``: its working directory; standard input is empty. Returns a
    CompletedProcess with ``returncode``, ``stdout`` and ``stderr`` (text). Environment,
    working directory, argv and streams are restored afterwards, and the registries the call
    opened are closed (their database connections released).
    """
    from specreg.cli import main
    from specreg.cli.root import OPENED_REGISTRIES

    argv = [str(a) for a in args]
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv, saved_stdin = dict(os.environ), os.getcwd(), sys.argv, sys.stdin
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update({key: str(value) for key, value in env.items()})
        if cwd is not None:
            os.chdir(cwd)
        sys.argv = ["specreg", *argv]
        sys.stdin = io.StringIO("")  # as CI runs it: nothing to read
        with redirect_stdout(stdout), redirect_stderr(stderr):
            try:
                main()
                code = 0
            except SystemExit as exc:
                # as the interpreter exits: None -> 0, an int as is, anything else printed -> 1
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 - what a real process would die of, printed the same way
                traceback.print_exc(file=sys.stderr)
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv, sys.stdin = saved_argv, saved_stdin
        for registry in OPENED_REGISTRIES:
            registry.store.engine.dispose()
        OPENED_REGISTRIES.clear()
    return subprocess.CompletedProcess(["specreg", *argv], code, stdout.getvalue(), stderr.getvalue())


def run(*args, env: dict | None = None, unset: tuple[str, ...] = (), user: str | None = None,
        ) -> subprocess.CompletedProcess:
    """``specreg *args`` in this process (run_specreg) with ``env`` added to this process's
    environment and the variables ``unset`` taken out of it; asserts that it printed no
    traceback, whatever its exit code.

    ``user``: run as that user: $SPECREG_USER, and each ``--db`` URL connecting as that
    PostgreSQL role (pgroles.as_user; SQLite URLs unchanged)."""
    if user is not None:
        from pgroles import as_user

        args = tuple(as_user(str(arg), user) if i and args[i - 1] == "--db" else arg for i, arg in enumerate(args))
        env = {**(env or {}), "SPECREG_USER": user}
    environment = {key: value for key, value in {**os.environ, **(env or {})}.items() if key not in unset}
    result = run_specreg(args, env=environment)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def run_process(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m specreg.cli ARGS` as a real process (the entry point as users start it), with
    ``env`` added to this process's environment; asserts that it printed no traceback."""
    result = subprocess.run(SPECREG + [str(a) for a in args], capture_output=True, text=True,
                            env={**os.environ, **(env or {})}, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def one_line(result: subprocess.CompletedProcess, code: int, *fragments: str) -> None:
    """Asserts a one-line error: exit ``code``, exactly one line on stderr, each fragment in it."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
