"""The migrations produce exactly the ORM schema, go up, down and up again, and an out-of-date
database is refused with the upgrade command named; on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from specreg.errors import SchemaOutOfDateError
from specreg.registry.store.migrate import head_revision, run_downgrade, run_upgrade
from specreg.registry.store.orm import Base
from specreg.registry.store.store import SCHEMA_HEAD, Store


def schema_diff(url: str) -> list:
    engine = create_engine(url)
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    return diff


def test_schema_head_constant_matches_alembic():
    assert SCHEMA_HEAD == head_revision()


def test_migrated_schema_equals_orm_metadata(db_url):
    Store(db_url)  # a fresh database is migrated on first use
    assert schema_diff(db_url) == []


def test_upgrade_downgrade_upgrade(db_url):
    store = Store(db_url)
    tables = set(inspect(store.engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    run_downgrade(store.engine, "base")
    assert set(inspect(store.engine).get_table_names()) <= {"alembic_version"}
    assert store.current_revision() is None
    run_upgrade(store.engine, "head")
    assert store.current_revision() == SCHEMA_HEAD
    assert schema_diff(db_url) == []


def test_out_of_date_database_is_refused_and_db_upgrade_fixes_it(db_url, tmp_path):
    store = Store(db_url)
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = '0000'")
    with pytest.raises(SchemaOutOfDateError, match="specreg db upgrade"):
        Store(db_url)
    cli = [sys.executable, "-m", "specreg.cli"]
    listing = subprocess.run(cli + ["list", "--db", db_url], capture_output=True, text=True)
    assert listing.returncode == 1
    assert listing.stderr.count("\n") == 1 and "run `specreg db upgrade`" in listing.stderr
    assert "Traceback" not in listing.stderr
    # Put the real revision back as if an old specreg had migrated it, then upgrade.
    with store.engine.begin() as connection:
        connection.exec_driver_sql(f"UPDATE alembic_version SET version_num = '{SCHEMA_HEAD}'")
    upgrade = subprocess.run(cli + ["db", "upgrade", "--db", db_url], capture_output=True, text=True)
    assert upgrade.returncode == 0, upgrade.stderr
    assert f"-> {SCHEMA_HEAD}" in upgrade.stdout
    Store(db_url)
