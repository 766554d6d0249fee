"""Alembic environment: runs on the connection handed in by ``registry.db.upgrade``."""
from alembic import context
from sqlalchemy import create_engine

from registry.orm import Base

config = context.config
target_metadata = Base.metadata


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # invoked from the alembic CLI
        engine = create_engine(config.get_main_option("sqlalchemy.url"))
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
            context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    context.run_migrations()


run()
