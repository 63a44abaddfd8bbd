"""Alembic, driven from Python: the migration scripts live in the `specreg.migrations` package.

Migrations are serialised across processes (``migration_lock``): six commands started at once
on a fresh database would otherwise all create the tables, and five fail (SQLite "database is
locked", PostgreSQL duplicate pg_type rows).
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

from sqlalchemy.engine import Engine

from specreg.errors import StoreError

# pg_advisory_lock key: any constant bigint, the same in every specreg process ("specreg!" in ASCII)
ADVISORY_LOCK_KEY = 0x7370656372656721
LOCK_WAIT_S = 120.0


def alembic_config(engine: Engine | None = None):
    from alembic.config import Config

    import specreg.migrations

    config = Config()
    config.set_main_option("script_location", str(Path(specreg.migrations.__file__).parent))
    if engine is not None:
        config.attributes["engine"] = engine
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def run_upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def run_downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(engine), revision)


@contextlib.contextmanager
def migration_lock(engine: Engine, timeout_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the database's migration lock for the duration: a session-level advisory lock on
    PostgreSQL (on a connection of its own), an exclusive flock on ``<database>.migrate.lock``
    beside an SQLite file (nothing for in-memory SQLite: one process). Waits up to
    ``timeout_s``, then StoreError."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            _wait(lambda: connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({ADVISORY_LOCK_KEY})").scalar(),
                  timeout_s, "the migration lock (pg_advisory_lock) held by another specreg process")
            connection.commit()
            try:
                yield
            finally:
                connection.exec_driver_sql(f"SELECT pg_advisory_unlock({ADVISORY_LOCK_KEY})")
                connection.commit()
        return
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database or database == ":memory:":
        yield
        return
    import fcntl

    path = Path(database).expanduser()
    path = path.with_name(path.name + ".migrate.lock")
    try:
        handle = open(path, "a")
    except OSError as exc:
        raise StoreError(f"cannot open the migration lock file {path}: {exc.strerror or exc}") from None

    def acquire() -> bool:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    with handle:
        _wait(acquire, timeout_s, f"the migration lock {path} held by another specreg process")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _wait(try_once, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not try_once():
        if time.monotonic() > deadline:
            raise StoreError(f"waited {timeout_s:g} s for {what}; is a migration stuck?")
        time.sleep(0.05)
