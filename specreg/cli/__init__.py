"""The `specreg` command line, split by command group: each command parses, calls the Python
API (``specreg.Registry``) and prints (tables for people, ``--json`` for machines).

``main`` is the entry point: user errors become one line on stderr and an exit code; ``run``,
the process's (the `specreg` script, ``python -m specreg.cli``), also ends it quickly.
"""

from __future__ import annotations

import errno
import sys

import click

from specreg.cli import (deploy, engine_baselines, governance, pipeline, registration, review,  # noqa: F401
                         validate_engine, validation)
from specreg.cli.root import cli, echo_err, printable, print_warnings
from specreg.errors import PathTooLongError, SpecregError

# the packages of the `validate` extra (pyproject.toml): a base or [gate] install lacks them, and
# only the commands that run models or talk to MLflow import them
VALIDATE_EXTRA = ("torch", "transformers", "safetensors", "tokenizers", "mlflow")


def run() -> None:
    """The `specreg` process: main, then an exit in which the garbage collector no longer walks
    every object torch, transformers and SQLAlchemy made (1.5-2 s at the end of `validate` on a
    2-core CPU; the process's memory goes back to the OS whole). atexit handlers, thread joins,
    stream flushes and module teardown still run; only cyclic garbage is not collected. Not for a
    caller that goes on running (tests call main)."""
    import gc

    try:
        main()
    finally:
        gc.freeze()


def main() -> None:
    """Entry point: user errors become one line on stderr and an exit code, never a traceback."""
    from specreg.runtime.process import prepare_process

    prepare_process()  # threads for torch and no library progress bars, before torch is imported
    try:
        try:
            code = cli.main(standalone_mode=False)
        finally:
            print_warnings()
    except click.exceptions.Abort:
        click.echo("specreg: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SpecregError as exc:
        lines = getattr(exc, "lines", None) or [f"error: {exc}"]  # a Refusal: one reason a line
        echo_err([f"specreg: {printable(line)}" if index == 0 else printable(line) for index, line in enumerate(lines)])
        sys.exit(exc.exit_code)
    except OSError as exc:
        # a path argument (-o, --out, --report, --target, --golden ...) the file system cannot hold;
        # each command checks its paths before it writes anything, so nothing was half-written
        if exc.errno != errno.ENAMETOOLONG:
            raise
        error = PathTooLongError(exc.filename if exc.filename is not None else "a path")
        click.echo(f"specreg: error: {printable(error)}", err=True)
        sys.exit(error.exit_code)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] not in VALIDATE_EXTRA:
            raise
        # one line within 100 columns for any of the names above
        click.echo(f"specreg: error: this command needs {exc.name} (not installed): pip install 'specreg[validate]'",
                   err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("specreg: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)

