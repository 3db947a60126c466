"""SQLite: each queued job's row of the queue snapshot (H3), rendered by the database and kept in an index.

The snapshot itself (gateway/decisions/queue_snapshot.py) joins these strings; the column and its index are part
of the schema, so they are made with it (gateway/store/schema.py).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

SAFE_INT = 2**53 - 1  # the I-JSON integer range; beyond it RFC 8785 prints a number like a float
# SQLite keeps each job's row rendered, in a virtual generated column that an index stores: a snapshot
# joins strings read from that index instead of rendering every queued job again for every decision.
_WHOLE_SQL = f"base_priority = CAST(base_priority AS INTEGER) AND abs(base_priority) <= {SAFE_INT}"
RENDERED_ROW_DDL = (
    "ALTER TABLE jobs ADD COLUMN snapshot_row TEXT GENERATED ALWAYS AS (CASE WHEN " + _WHOLE_SQL + " THEN"
    " json_array(id, project, queue, CAST(base_priority AS INTEGER), gpus_per_node * nodes) END) VIRTUAL")
RENDERED_ROW_INDEX = ("CREATE INDEX IF NOT EXISTS ix_jobs_queue_snapshot_rows"
                      " ON jobs (state, queue, base_priority DESC, submitted_at, id, snapshot_row)")


def add_rendered_rows(connection: Connection) -> None:
    """SQLite: add the rendered-row column and its index to a jobs table that lacks them."""
    if "snapshot_row" not in {row[1] for row in connection.exec_driver_sql("PRAGMA table_xinfo(jobs)")}:
        connection.exec_driver_sql(RENDERED_ROW_DDL)
    connection.exec_driver_sql(RENDERED_ROW_INDEX)
