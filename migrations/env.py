"""Alembic environment: runs on the engine specreg hands over (``config.attributes['engine']``)
or on ``sqlalchemy.url``; batch mode so that SQLite can alter tables."""

from alembic import context
from sqlalchemy import create_engine

from specreg.registry.store.orm import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    engine = config.attributes.get("engine") or create_engine(config.get_main_option("sqlalchemy.url"))
    # Alembic's own transaction: plain BEGIN, also on SQLite where specreg wraps BEGIN itself.
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_migrations_online()
