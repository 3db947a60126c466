"""What the agent keeps on disk so a restart changes nothing: seen nonces, its processes, unsent reports.

Every file is rewritten whole through a temporary file and `os.replace`, so a crash leaves either the
old or the new content, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeagent.runner import ProcessRecord

log = logging.getLogger("nodeagent.state")


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _load_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default
    except (ValueError, OSError) as e:
        # Keep the unreadable file for forensics; starting fresh beats refusing to start.
        log.error("unreadable state file %s (%s); kept as %s.corrupt", path, e, path.name)
        os.replace(path, path.with_name(path.name + ".corrupt"))
        return default


class NonceStore:
    """Nonces of accepted commands, kept until their command expires (after which expiry alone refuses it).

    `<work_dir>/nonces.json`: `{nonce: expires_at}`.
    """

    def __init__(self, path: Path, clock: Callable[[], float]) -> None:
        self._path = path
        self._clock = clock
        self._lock = threading.Lock()
        raw = _load_json(path, {})
        self._nonces: dict[str, float] = {}
        if isinstance(raw, dict):
            for nonce, expires_at in raw.items():
                try:
                    self._nonces[str(nonce)] = float(expires_at)
                except (TypeError, ValueError):
                    continue

    def seen(self, nonce: str) -> bool:
        with self._lock:
            return nonce in self._nonces

    def remember(self, nonce: str, expires_at: float) -> None:
        """Persist the nonce before the command runs, so a crash mid-command cannot enable a replay."""
        with self._lock:
            now = self._clock()
            self._nonces = {n: e for n, e in self._nonces.items() if e >= now}
            self._nonces[nonce] = expires_at
            write_atomically(self._path, json.dumps(self._nonces, sort_keys=True))


class ProcessStore:
    """`<work_dir>/processes.json`: the job process groups this node runs, by job id."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._records: dict[str, ProcessRecord] = {}
        raw = _load_json(path, {})
        if isinstance(raw, dict):
            for job_id, data in raw.items():
                try:
                    self._records[str(job_id)] = ProcessRecord.from_json(data)
                except (KeyError, TypeError, ValueError):
                    log.error("dropping malformed process record for %s", job_id)

    def records(self) -> list[ProcessRecord]:
        with self._lock:
            return list(self._records.values())

    def put(self, record: ProcessRecord) -> None:
        with self._lock:
            self._records[record.job_id] = record
            self._save()

    def remove(self, job_id: str, pid: int | None = None) -> None:
        """Forget the job; with `pid`, only if the record is still that process (not a restart of it)."""
        with self._lock:
            record = self._records.get(job_id)
            if record is not None and (pid is None or record.pid == pid):
                del self._records[job_id]
                self._save()

    def _save(self) -> None:
        data = {job_id: r.to_json() for job_id, r in sorted(self._records.items())}
        write_atomically(self._path, json.dumps(data, indent=1))


class Outbox:
    """`<work_dir>/outbox.jsonl`: reports not yet acknowledged by the gateway, oldest first."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._pending: list[dict[str, Any]] = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                report = json.loads(line)
            except ValueError:
                # A torn last line from a crash mid-append; the rest is still good.
                log.error("skipping unreadable outbox line")
                continue
            if isinstance(report, dict):
                self._pending.append(report)

    def append(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._pending.append(report)
            with self._path.open("a", encoding="utf-8") as f:
                f.write(json.dumps(report, separators=(",", ":")) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def peek(self, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._pending[:limit])

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def reject_first(self, why: str) -> dict[str, Any]:
        """Move the oldest report, which the gateway refused as it is, to `outbox.rejected.jsonl` beside the
        outbox (with the refusal) so that the reports behind it can go; returns it."""
        with self._lock:
            report = self._pending[0]
            line = json.dumps({"report": report, "refused": why}, separators=(",", ":")) + "\n"
            with self._path.with_suffix(".rejected.jsonl").open("a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        self.drop_first(1)
        return report

    def drop_first(self, count: int) -> None:
        """Forget the `count` oldest reports once the gateway has acknowledged them."""
        with self._lock:
            del self._pending[:count]
            text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in self._pending)
            write_atomically(self._path, text)
