"""Where specreg keeps its state and who is acting: environment variables and their defaults."""

from __future__ import annotations

import getpass
import os
from pathlib import Path


def specreg_home() -> Path:
    """``$SPECREG_HOME``, default ``~/.specreg``."""
    return Path(os.environ.get("SPECREG_HOME") or Path.home() / ".specreg").expanduser()


def default_db_url() -> str:
    """``$SPECREG_DB`` or the embedded SQLite file ``$SPECREG_HOME/registry.db``."""
    url = os.environ.get("SPECREG_DB")
    if url:
        return url
    return f"sqlite:///{specreg_home() / 'registry.db'}"


def default_mlflow_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or the embedded local store under ``$SPECREG_HOME/mlflow``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{specreg_home() / 'mlflow' / 'mlflow.db'}"


def current_user(explicit: str | None = None) -> str:
    """Who acts: ``--user``, then ``$SPECREG_USER``, then the OS user."""
    if explicit:
        return explicit
    env_user = os.environ.get("SPECREG_USER")
    if env_user:
        return env_user
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers): still name someone
        return f"uid-{os.getuid()}"
