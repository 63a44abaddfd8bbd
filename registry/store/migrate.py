"""Alembic, driven from Python: the migration scripts live in the `specreg.migrations` package."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine


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
