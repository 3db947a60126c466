"""A gateway on a SQLite library older than the one its statements need refuses to start, saying why (`jobgate up`
prints a GatewayError's detail as its one line)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.errors import SqliteTooOld
from gateway.store.db import Database


def test_a_sqlite_library_older_than_3_38_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite3, "sqlite_version_info", (3, 37, 2))
    monkeypatch.setattr(sqlite3, "sqlite_version", "3.37.2")
    with pytest.raises(SqliteTooOld, match=r"^SQLite 3\.37\.2 is too old: the gateway needs 3\.38 or later"):
        Database(f"sqlite:///{tmp_path / 'jobgate.db'}")
    assert not (tmp_path / "jobgate.db").exists()  # refused before anything was made
