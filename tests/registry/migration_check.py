"""One check for a migration that adds a table: on the database given, the table comes with ``revision``
with exactly its columns and primary key, goes with the downgrade to ``before``, and head brings it back."""
from __future__ import annotations

from sqlalchemy import inspect

from registry.db import make_engine, migrations


def check_table_migration(database_url: str, before: str, revision: str, table: str,
                          columns: set[str], primary_key: list[str]) -> None:
    from alembic import command

    engine = make_engine(database_url)
    with migrations(engine) as (conn, cfg):
        command.upgrade(cfg, before)
        assert table not in inspect(conn).get_table_names()
        command.upgrade(cfg, revision)
        assert {c["name"] for c in inspect(conn).get_columns(table)} == columns
        assert inspect(conn).get_pk_constraint(table)["constrained_columns"] == primary_key
        command.downgrade(cfg, before)
        assert table not in inspect(conn).get_table_names()
        command.upgrade(cfg, "head")
        assert table in inspect(conn).get_table_names()
    engine.dispose()
