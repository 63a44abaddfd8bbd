"""The database underneath the store: the engine for a URL (SQLite with its write locking,
PostgreSQL with its driver), and database errors as one line naming the database without its
password. Only registry/store imports this (docs/design.md §1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

from specreg.errors import StoreError

SQLITE_BUSY_TIMEOUT_MS = 30_000


def safe_url(url: str) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def create_db_engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise StoreError(f"database URL {url!r} is not a valid SQLAlchemy URL") from None
    try:
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and "\0" in parsed.database:
                raise StoreError(f"database {safe_url(url)}: the file name holds a NUL byte")
            if parsed.database and parsed.database != ":memory:":
                folder = Path(parsed.database).expanduser().parent
                try:  # $SPECREG_HOME or --db under a file, in /proc, with a NUL byte: one line
                    folder.mkdir(parents=True, exist_ok=True)
                except (OSError, ValueError) as exc:
                    reason = "a file is in the way" if isinstance(exc, FileExistsError) else \
                        getattr(exc, "strerror", None) or str(exc)
                    raise StoreError(f"database {safe_url(url)}: cannot create its folder {folder}: {reason}") from None
            engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
            install_sqlite_locking(engine)
            return engine
        if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() in ("psycopg2", "") :
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_pre_ping=True, connect_args=connect_timeout_args(parsed))
    except (NoSuchModuleError, ModuleNotFoundError) as exc:
        raise StoreError(f"database URL {safe_url(url)}: driver not installed ({exc})") from None


def connect_timeout_args(parsed) -> dict[str, Any]:
    return {"connect_timeout": 5} if parsed.get_backend_name() == "postgresql" else {}


def install_sqlite_locking(engine: Engine) -> None:
    """Let SQLAlchemy, not pysqlite, emit BEGIN, so write sessions can BEGIN IMMEDIATE."""

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def on_begin(connection):
        immediate = connection.get_execution_options().get("specreg_write", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def describe_db_error(url: str, exc: Exception) -> str:
    first_line = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"database {safe_url(url)}: {first_line}"


def sqlite_file(url: str) -> Path | None:
    """The file of an SQLite database URL (None: another database, or in memory); ValueError for a
    URL that does not parse."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - any unparsable URL: the caller names it in one line
        raise ValueError(f"{url!r} is not a database URL") from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database).expanduser()


def operational_errors() -> tuple[type[Exception], ...]:
    """What a database that is locked, unreadable or unreachable raises (SQLAlchemy's
    OperationalError), for callers that must tell it from a bug without importing SQLAlchemy."""
    return (OperationalError,)
