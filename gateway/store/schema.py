"""The business database's schema: every table module, created together, and what SQLite adds to them.

Add one import line here when you add a module with tables (they all share `gateway.store.models.Base`). Every
table lives in this room, so making the schema imports no service.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, MetaData, inspect, text

from gateway.store import replica_tables, scheduler_tables, service_tables, stop_tables
from gateway.store.models import Base
from gateway.store.snapshot_rows import add_rendered_rows
from gateway.store.submission_rows import add_submission_view

TABLE_MODULES = (replica_tables, scheduler_tables, service_tables, stop_tables)  # besides gateway.store.models itself


_SCHEMA_LOCK = 7305620  # transaction advisory lock (PostgreSQL): replicas starting at once create one schema


def create_schema(engine: Engine) -> None:
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # CREATE TABLE IF NOT EXISTS races in PostgreSQL (two replicas' first starts: a duplicate pg_type row).
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _SCHEMA_LOCK})
        Base.metadata.create_all(conn)
        # create_all makes the indexes of new tables only: add those a newer version declares to older tables.
        add_missing_columns(conn, Base.metadata)
        for table in Base.metadata.sorted_tables:
            for index in table.indexes:
                index.create(conn, checkfirst=True)
        if engine.dialect.name == "sqlite":
            add_rendered_rows(conn)
            add_submission_view(conn)


def add_missing_columns(conn: Connection, metadata: MetaData) -> list[str]:
    """ALTER TABLE ... ADD COLUMN for each nullable column a newer version declares on a table an older one made
    (a data dir kept across an upgrade); returns them as `table.column`. Only nullable columns are added this way:
    a column that needs a value for the existing rows needs a migration of its own."""
    added = []
    inspector = inspect(conn)
    for table in metadata.sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present or not column.nullable:
                continue
            kind = column.type.compile(dialect=conn.dialect)
            conn.execute(text(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}'))
            added.append(f"{table.name}.{column.name}")
    return added
