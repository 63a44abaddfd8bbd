"""Where MLflow keeps things and how to reach them: the artifact folder of a local store, the
`specreg ui` command line, and the UI addresses of model versions."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from specreg.errors import UsageError


def local_artifact_root(tracking_uri: str) -> Path | None:
    """For a local store (``sqlite:///DIR/x.db`` or a plain folder) the folder its artifacts
    belong in: ``DIR/artifacts``; None for a server (http/https/databricks ...)."""
    parsed = urlparse(tracking_uri)
    if parsed.scheme == "sqlite":
        # sqlite:////abs/path.db -> path "//abs/path.db"; sqlite:///rel.db -> "/rel.db"
        db_path = Path(unquote(tracking_uri[len("sqlite:///"):]))
        return db_path.expanduser().resolve().parent / "artifacts"
    if parsed.scheme in ("", "file"):
        return Path(unquote(parsed.path)).expanduser().resolve() / "artifacts"
    return None


def ui_command(tracking_uri: str, host: str = "127.0.0.1", port: int = 5000) -> list[str]:
    """argv that serves the MLflow UI over a local store: ``python -m mlflow server
    --backend-store-uri URI --default-artifact-root DIR --host HOST --port P``.
    Raises UsageError for a remote tracking URI (there is a server already: open it)."""
    artifact_root = local_artifact_root(tracking_uri)
    if artifact_root is None:
        raise UsageError(
            f"MLflow tracking URI {tracking_uri} is a server already; open it in a browser"
        )
    return [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", tracking_uri,
        "--default-artifact-root", str(artifact_root),
        "--host", host,
        "--port", str(port),
    ]


def model_version_url(base_url: str, name: str, version: int | str) -> str:
    """UI address of a model version: ``BASE/#/models/<name>/versions/<v>`` (the MLflow 3
    React app's hash route ``/models/:modelName/versions/:version``)."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(name), safe='')}/versions/{version}"


def registered_model_url(base_url: str, name: str) -> str:
    """UI address of a registered model: ``BASE/#/models/<name>``."""
    return f"{base_url.rstrip('/')}/#/models/{quote(str(name), safe='')}"
