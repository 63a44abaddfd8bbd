"""The MLflow mirror's helper process (usecases/mirror.MirrorHelper), started by `validate`:
``python -m specreg.cli.mirror_helper URI`` opens MLflow's store at URI (empty: the registry's
default), then reads one request line {"db_url", "user", "mlflow_uri", "ref"} from stdin, mirrors
that version and answers {"warnings": [...]} on stdout; an empty stdin ends it."""

from __future__ import annotations

import json
import os
import sys


def serve(mlflow_uri: str | None) -> int:
    from specreg.errors import MlflowUnavailable
    from specreg.registry.review.mlflow_sync import MlflowSync

    if hasattr(os, "nice"):
        os.nice(10)  # idle time only: the command it overlaps comes first
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
    print(json.dumps({"warnings": registry.warnings}))
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else None))
