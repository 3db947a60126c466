"""SQLite: each queued job's row of the queue snapshot (H3), rendered by the database and kept in an index, and a
token that changes with every change of the queue.

The snapshot itself (gateway/decisions/queue_snapshot.py) joins these strings, and takes it again only when the
token has changed since it last did; the column, its index, the token's row and its triggers are part of the
schema, so they are made with it (gateway/store/schema.py).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from gateway.store.states import PENDING_STATES

SAFE_INT = 2**53 - 1  # the I-JSON integer range; beyond it RFC 8785 prints a number like a float
# SQLite keeps each job's row rendered, in a virtual generated column that an index stores: a snapshot
# joins strings read from that index instead of rendering every queued job again for every decision.
_WHOLE_SQL = f"base_priority = CAST(base_priority AS INTEGER) AND abs(base_priority) <= {SAFE_INT}"
RENDERED_ROW_DDL = (
    "ALTER TABLE jobs ADD COLUMN snapshot_row TEXT GENERATED ALWAYS AS (CASE WHEN " + _WHOLE_SQL + " THEN"
    " json_array(id, project, queue, CAST(base_priority AS INTEGER), gpus_per_node * nodes) END) VIRTUAL")
RENDERED_ROW_INDEX = ("CREATE INDEX IF NOT EXISTS ix_jobs_queue_snapshot_rows"
                      " ON jobs (state, queue, base_priority DESC, submitted_at, id, snapshot_row)")



# Every column of jobs the snapshot reads: which rows (state), their order (queue, base_priority, submitted_at,
# id) and what each row says (id, project, queue, base_priority, gpus_per_node, nodes).
# tests/gateway/decisions/test_queue_snapshot.py checks the snapshot's statements read no other.
SNAPSHOT_READS = ("state", "id", "project", "queue", "base_priority", "submitted_at", "gpus_per_node", "nodes")
# The queue's token: one row, given new random bytes by the triggers below in the transaction of every change
# of a queued job (inserted, deleted, or one of SNAPSHOT_READS updated while or into being queued), whoever
# makes it, this process or another. Equal tokens therefore mean the same queue, so a snapshot taken under
# one serves every decision that reads the same token; random rather than a counter, so a change rolled back
# leaves no token that another change could reuse for another queue.
QUEUE_TOKEN_TABLE = "jobs_queue_token"
QUEUE_TOKEN_SQL = f"SELECT token FROM {QUEUE_TOKEN_TABLE} WHERE id = 1"
_QUEUED = "({}.state IN (" + ", ".join(f"'{s}'" for s in PENDING_STATES) + "))"
_NEW_TOKEN = f"BEGIN UPDATE {QUEUE_TOKEN_TABLE} SET token = randomblob(16) WHERE id = 1; END"
_TOKEN_TRIGGERS = {
    f"{QUEUE_TOKEN_TABLE}_insert": f"AFTER INSERT ON jobs WHEN {_QUEUED.format('NEW')}",
    f"{QUEUE_TOKEN_TABLE}_delete": f"AFTER DELETE ON jobs WHEN {_QUEUED.format('OLD')}",
    f"{QUEUE_TOKEN_TABLE}_update": (f"AFTER UPDATE OF {', '.join(SNAPSHOT_READS)} ON jobs"
                                    f" WHEN {_QUEUED.format('OLD')} OR {_QUEUED.format('NEW')}"),
}


def add_rendered_rows(connection: Connection) -> None:
    """SQLite: add the rendered-row column and its index to a jobs table that lacks them, and the queue's token
    with its triggers (made again each time, so that they follow SNAPSHOT_READS and PENDING_STATES)."""
    if "snapshot_row" not in {row[1] for row in connection.exec_driver_sql("PRAGMA table_xinfo(jobs)")}:
        connection.exec_driver_sql(RENDERED_ROW_DDL)
    connection.exec_driver_sql(RENDERED_ROW_INDEX)
    connection.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS {QUEUE_TOKEN_TABLE}"
                               " (id INTEGER PRIMARY KEY CHECK (id = 1), token BLOB NOT NULL)")
    # A new token here too: the triggers are replaced below, and a change made meanwhile by an older version
    # without them must not leave an old token standing for a new queue.
    connection.exec_driver_sql(f"INSERT INTO {QUEUE_TOKEN_TABLE} (id, token) VALUES (1, randomblob(16))"
                               " ON CONFLICT (id) DO UPDATE SET token = excluded.token")
    for name, when in _TOKEN_TRIGGERS.items():
        connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
        connection.exec_driver_sql(f"CREATE TRIGGER {name} {when} {_NEW_TOKEN}")
