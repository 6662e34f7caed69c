"""Alembic environment: runs the migrations against the URL the caller configured."""

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlmodel import SQLModel

from serve_app.db import tables  # noqa: F401  (registers the tables on the metadata)

config = context.config
target_metadata = SQLModel.metadata

if not config.get_main_option("sqlalchemy.url"):  # alembic's own command line
    from serve_app.db.engine import normalise_url
    from serve_app.settings import Settings

    config.set_main_option("sqlalchemy.url",
                           normalise_url(Settings().resolved_database_url).replace("%", "%%"))


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        connectable = engine_from_config(
            config.get_section(config.config_ini_section, {}),
            prefix="sqlalchemy.",
            poolclass=pool.NullPool,
        )
    with connectable.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


run_migrations_online()
