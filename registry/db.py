"""Database engine and schema migration (Alembic) for SQLite and PostgreSQL."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.orm import sessionmaker

if TYPE_CHECKING:
    import psycopg

MIGRATIONS = Path(__file__).with_name("migrations")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_pre_ping=True)


def libpq_url(url: str) -> str:
    """The database URL as psycopg itself takes it: the dedicated connections that hold the leader
    lock and listen for config changes (registry/leadership.py, registry/config_notify.py) are not
    SQLAlchemy's, whose pool would hand them to anyone."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


# TCP settings of those connections, at both ends: a peer that vanishes without closing (a node lost, a
# partition) is given up in about 10 s, by the client (keepalives while idle, tcp_user_timeout for a query
# never acknowledged) and by the server (the same settings, asked for per session), which then ends the
# session and, with it, the leader's lock. A process that exits closes its socket: that is seen at once.
_CLIENT_TCP = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 2,
               "tcp_user_timeout": 10_000, "connect_timeout": 5}
_SERVER_TCP = ("-c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=2 "
               "-c tcp_user_timeout=10000")


def dedicated_connection(url: str, purpose: str) -> "psycopg.Connection":
    """An autocommit psycopg connection of its own, named ``serving <purpose>`` in pg_stat_activity."""
    import psycopg  # PostgreSQL only: SQLite deployments never load it

    given = make_url(url).query.get("options")
    options = " ".join(o for o in (given if isinstance(given, str) else None, _SERVER_TCP) if o)
    return psycopg.connect(libpq_url(url), autocommit=True, application_name=f"serving {purpose}", options=options,
                           **_CLIENT_TCP)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.close()


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


@contextmanager
def migrations(engine: Engine) -> Iterator[tuple[Connection, Config]]:
    """An Alembic config bound to one transaction on ``engine`` (env.py runs on the connection handed in):
    what starts use to upgrade, and what migration tests use to stop at a revision and look."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        yield conn, cfg


def upgrade(engine: Engine) -> None:
    """Bring the schema to the newest migration; safe to run on every start."""
    with migrations(engine) as (_, cfg):
        command.upgrade(cfg, "head")


def session_factory(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)
