"""Acting as a user on PostgreSQL means authenticating as that role (specreg takes the actor
from ``session_user``). ``as_user(db_url, "alice")`` returns the URL that connects as role
``alice`` (created on first use: LOGIN, trust auth on the test server) with the least-privilege
grants docs/governance.md recommends (`specreg db grants alice`: read everything, insert, update only
what specreg updates, delete nothing) on that database; a SQLite URL comes back unchanged
(identity there is advisory: pass ``user=``)."""

from __future__ import annotations

import contextlib
import os
import uuid

from sqlalchemy.engine import make_url

PG_ADMIN_URL = os.environ.get("SPECREG_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def admin_connect(dbname: str | None = None):
    import psycopg

    conninfo = psycopg.conninfo.make_conninfo(PG_ADMIN_URL, **({"dbname": dbname} if dbname else {}))
    return psycopg.connect(conninfo, autocommit=True, connect_timeout=5)


@contextlib.contextmanager
def fresh_database(owner: str = "tester"):
    """A fresh, empty database owned by and connected as role ``owner`` -> its SQLAlchemy URL;
    dropped on leaving the block (its connections ended first)."""
    import psycopg

    name = f"specreg_test_{uuid.uuid4().hex[:12]}"
    ensure_role(owner)
    with admin_connect() as connection:
        connection.execute(f'CREATE DATABASE "{name}" OWNER "{owner}"')
    info = psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL)
    try:
        yield f"postgresql+psycopg://{owner}@{info.get('host', '127.0.0.1')}:{info.get('port', 5432)}/{name}"
    finally:
        with admin_connect() as connection:
            connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
            connection.execute(f'DROP DATABASE IF EXISTS "{name}"')


def ensure_role(name: str, dbname: str | None = None) -> None:
    """CREATE ROLE name LOGIN (if missing); with ``dbname``, the least-privilege grants there."""
    import psycopg
    from psycopg import sql

    with admin_connect() as connection:
        exists = connection.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
        if not exists:
            try:
                connection.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
            except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                pass  # another test process created it first
        # roles of earlier runs had the broad predefined roles: least privilege now
        connection.execute(sql.SQL("REVOKE pg_read_all_data, pg_write_all_data FROM {}").format(sql.Identifier(name)))
    if dbname is not None:
        from specreg.registry.store.grants import grants_sql

        with admin_connect(dbname) as connection:
            # GRANTs on the same tables from parallel processes (the racing-promote workers each
            # take their role at start) fail with "tuple concurrently updated": one at a time
            connection.execute("SELECT pg_advisory_lock(7031)")
            try:
                connection.execute(grants_sql(name))
            finally:
                connection.execute("SELECT pg_advisory_unlock(7031)")


def as_user(db_url: str, name: str) -> str:
    """``db_url`` connecting as role ``name`` on PostgreSQL; unchanged for SQLite."""
    url = make_url(db_url)
    if url.get_backend_name() != "postgresql":
        return db_url
    from specreg.registry.store.store import Store

    Store(db_url).engine.dispose()  # the owner migrates a fresh database first: users cannot create tables
    ensure_role(name, url.database)
    return url.set(username=name).render_as_string(hide_password=False)
