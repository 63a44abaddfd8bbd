"""The MLflow mirror's helper process (usecases/mirror.MirrorHelper), started by `validate`:
``python -m specreg.cli.mirror_helper URI`` opens MLflow's store at URI (empty: the registry's
default), then reads one request line {"db_url", "user", "mlflow_uri", "ref"} from stdin, mirrors
that version and answers {"warnings": [...]} on stdout; an empty stdin ends it."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time


def lower_priority(autogroup: str = "/proc/self/autogroup") -> None:
    """Idle time only: the command this helper overlaps comes first. The helper runs in a session
    of its own (Ctrl-C on the command must not stop a store's migrations halfway), and on Linux a
    new session is a scheduling autogroup of its own, inside which alone a nice value counts: the
    group's nice is what lowers the helper against the command (measured on a 2-core VM: at nice
    10 alone it still took a whole core from the command's start-up)."""
    if not hasattr(os, "nice"):
        return
    os.nice(10)
    if os.getsid(0) != os.getpid():
        return  # not its own session (run by hand or by a test): the autogroup is its caller's too
    for _ in range(2):
        try:
            with open(autogroup, "w") as handle:
                handle.write("10")
            return
        except BlockingIOError:
            time.sleep(0.1)  # Linux takes one such write a tenth of a second from unprivileged users
        except OSError:
            return  # no autogroups (another system, or turned off): the process's nice is the one that counts


def serve(mlflow_uri: str | None) -> int:
    from specreg.errors import MlflowUnavailable
    from specreg.registry.review.mlflow_sync import MlflowSync

    lower_priority()
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    try:
        MlflowSync(mlflow_uri or None).ping()  # the import and the store's set-up
    except MlflowUnavailable:
        pass  # the mirror below says so, as the command would
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    from specreg.api import Registry

    request = json.loads(line)
    registry = Registry(request["db_url"], request["user"], request["mlflow_uri"])
    registry.mirror(request["ref"])
    print(json.dumps({"warnings": registry.warnings}), flush=True)
    return 0


def exit_without_teardown(status: list[int]) -> None:
    """End the process once the other exit handlers (MLflow's, logging's) have run, skipping the
    interpreter's teardown of MLflow's and SQLAlchemy's modules: about a second on a 2-core VM
    that the command waiting for this helper's exit would sit out. Everything the helper writes is
    committed by then and its answer flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status[0])


if __name__ == "__main__":
    exit_status = [1]  # an uncaught error keeps 1
    atexit.register(exit_without_teardown, exit_status)  # the first registered runs last
    exit_status[0] = serve(sys.argv[1] if len(sys.argv) > 1 else None)
    sys.exit(exit_status[0])
