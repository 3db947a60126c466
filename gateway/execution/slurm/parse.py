"""Read Slurm 22.05's JSON (data parser openapi/v0.0.38 and dbv0.0.38) into the client's records.

`squeue --json` and slurmrestd's GET /slurm/v0.0.38/jobs print the same document ({"meta", "errors",
"jobs"}), as do `sacct --json` and GET /slurmdb/v0.0.38/jobs. What 22.05 does that a reader must know:

1. Exit codes differ in shape: squeue gives the raw wait status as an int (768 = exit 3, 9 = SIGKILL);
   sacct gives {"status", "return_code", "signal": {"signal_id"}}.
2. Times are epoch seconds; 0 means none.
3. Unset numbers are null (`nice` is null when 0; `time_limit` null when there is none), and a negative
   nice comes out as its unsigned 32-bit pattern (-10 as 4294967286).
4. A document can carry `errors` with exit status 0 (squeue --json when slurmctld is down): the caller
   decides what each means, so they are returned beside the jobs.

Every function raises SlurmBadOutput (never KeyError, TypeError or ValueError) on what it cannot read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from gateway.execution.slurm.errors import SlurmBadOutput
from gateway.execution.slurm.records import AccountedJob, ExitStatus, QueuedJob, SlurmJobId, StartEstimate

T = TypeVar("T")
_GPU_PER_NODE = re.compile(r"(?:^|,)gres:gpu(?::[^:,]+)?:(\d+)")


@dataclass(frozen=True)
class DocumentError:
    """One entry of a document's `errors` list."""

    number: int
    error: str
    description: str
    source: str

    def line(self) -> str:
        return " ".join(p for p in (self.source + ":" if self.source else "", self.error, self.description) if p)


def load_document(text: str, command: str, user: str | None = None) -> dict[str, Any]:
    """The JSON object Slurm printed. Raises SlurmBadOutput."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise SlurmBadOutput(command, f"not JSON ({e.msg} at line {e.lineno})", user) from e
    except RecursionError as e:
        raise SlurmBadOutput(command, "JSON nested too deeply", user) from e
    if not isinstance(doc, dict):
        raise SlurmBadOutput(command, f"a JSON {type(doc).__name__} where an object was expected", user)
    return doc


def document_errors(doc: Mapping[str, Any], command: str, user: str | None = None) -> list[DocumentError]:
    """The document's `errors` entries. Raises SlurmBadOutput."""
    raw = doc.get("errors", [])
    if not isinstance(raw, list):
        raise SlurmBadOutput(command, "'errors' is not a list", user)
    out = []
    for e in raw:
        if not isinstance(e, dict):
            raise SlurmBadOutput(command, "an entry of 'errors' is not an object", user)
        number = e.get("error_number", 0)
        out.append(DocumentError(number=number if isinstance(number, int) else -1, error=str(e.get("error") or ""),
                               description=str(e.get("description") or ""), source=str(e.get("source") or "")))
    return out


def _jobs(doc: Mapping[str, Any], command: str, user: str | None) -> list[dict[str, Any]]:
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or not all(isinstance(j, dict) for j in jobs):
        raise SlurmBadOutput(command, "'jobs' is missing or not a list of objects", user)
    return jobs


class _Reader:
    """Typed access to one job object; every miss becomes SlurmBadOutput naming the field and the job."""

    def __init__(self, obj: Mapping[str, Any], command: str, user: str | None) -> None:
        self.obj, self.command, self.user = obj, command, user
        self.where = f"job {obj.get('job_id', '?')}"

    def fail(self, key: str, why: str) -> SlurmBadOutput:
        return SlurmBadOutput(self.command, f"{self.where}: field {key!r} {why}", self.user)

    def get(self, key: str, kind: type[T] | tuple[type, ...], *, optional: bool = False,
            src: Mapping[str, Any] | None = None) -> Any:
        src = self.obj if src is None else src
        if key not in src:
            if optional:
                return None
            raise self.fail(key, "is missing")
        value = src[key]
        if value is None and optional:
            return None
        # bool is an int in Python; Slurm's numbers are never booleans
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.fail(key, f"is {type(value).__name__}, not {getattr(kind, '__name__', kind)}")
        return value

    def text(self, key: str, src: Mapping[str, Any] | None = None) -> str:
        value = self.get(key, str, optional=True, src=src)
        return value if value is not None else ""

    def int_or_none(self, key: str, src: Mapping[str, Any] | None = None) -> int | None:
        value: int | None = self.get(key, int, optional=True, src=src)
        return value

    def time(self, key: str, src: Mapping[str, Any] | None = None) -> datetime | None:
        value = self.int_or_none(key, src)
        if not value:
            return None
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError) as e:
            raise self.fail(key, f"is no time ({value})") from e

    def sub(self, key: str, *, optional: bool = False) -> dict[str, Any]:
        value = self.get(key, dict, optional=optional)
        return value if value is not None else {}


def _signed32(value: int) -> int:
    # squeue --json prints a negative nice as its unsigned 32-bit pattern (-10 as 4294967286)
    return value - 2**32 if value >= 2**31 else value


def _wait_status(raw: int) -> ExitStatus:
    # squeue: the raw wait(2) status. A signal in the low 7 bits, else the exit code in bits 8-15.
    sig = raw & 0x7F
    return ExitStatus(code=None, signal=sig) if sig else ExitStatus(code=(raw >> 8) & 0xFF, signal=None)


def _db_exit(r: _Reader, key: str, src: Mapping[str, Any]) -> ExitStatus:
    value = r.get(key, dict, src=src)
    code = r.int_or_none("return_code", value)
    signal_obj = r.get("signal", dict, optional=True, src=value)
    signal = r.int_or_none("signal_id", signal_obj) if signal_obj else None
    if value.get("status") == "SIGNALED" and signal:
        return ExitStatus(code=None, signal=signal)
    return ExitStatus(code=code, signal=signal or None)


def _parse_each(jobs: list[dict[str, Any]], one: Callable[[_Reader], T], command: str, user: str | None) -> list[T]:
    return [one(_Reader(obj, command, user)) for obj in jobs]


def _queued(r: _Reader) -> QueuedJob:
    tres_per_node = r.text("tres_per_node")
    m = _GPU_PER_NODE.search(tres_per_node)
    exit_raw = r.int_or_none("exit_code")
    return QueuedJob(
        job_id=SlurmJobId(r.get("job_id", int)),
        name=r.text("name"),
        user=r.text("user_name"),
        account=r.text("account"),
        partition=r.text("partition"),
        qos=r.text("qos"),
        state=r.get("job_state", str),
        reason=r.text("state_reason"),
        priority=r.int_or_none("priority") or 0,
        nice=_signed32(r.int_or_none("nice") or 0),
        comment=r.text("comment"),
        nodes=r.int_or_none("node_count") or 0,
        node_list=r.text("nodes"),
        gpus_per_node=int(m.group(1)) if m else 0,
        gres=tres_per_node,
        time_limit_min=r.int_or_none("time_limit"),
        restarts=r.int_or_none("restart_cnt") or 0,
        requeue=bool(r.get("requeue", bool, optional=True)),
        submit_time=r.time("submit_time"),
        eligible_time=r.time("eligible_time"),
        start_time=r.time("start_time"),
        end_time=r.time("end_time"),
        exit=_wait_status(exit_raw or 0),
    )


def _accounted(r: _Reader) -> AccountedJob:
    t = r.sub("time")
    state = r.sub("state")
    comment = r.sub("comment", optional=True)
    tres = r.sub("tres", optional=True)
    gpus = 0
    for kind in ("allocated", "requested"):
        entries = tres.get(kind) or []
        if not isinstance(entries, list):
            raise r.fail("tres", f"'{kind}' is not a list")
        gpus = sum(int(e.get("count") or 0) for e in entries
                   if isinstance(e, dict) and e.get("type") == "gres" and e.get("name") == "gpu")
        if gpus:
            break
    batch_exit, batch_state = None, None
    steps = r.get("steps", list, optional=True) or []
    for step in steps:
        if isinstance(step, dict) and isinstance(step.get("step"), dict) and step["step"].get("id") == "batch":
            batch_exit = _db_exit(r, "exit_code", step)
            batch_state = r.text("state", step) or None
    return AccountedJob(
        job_id=SlurmJobId(r.get("job_id", int)),
        name=r.text("name"),
        user=r.text("user"),
        account=r.text("account"),
        partition=r.text("partition"),
        qos=r.text("qos"),
        state=r.get("current", str, src=state),
        reason=r.text("reason", state),
        comment=r.get("job", str, optional=True, src=comment),
        priority=r.int_or_none("priority"),
        nodes=r.text("nodes"),
        gpus=gpus,
        cancelled_by=r.get("kill_request_user", str, optional=True),
        submit_time=r.time("submission", t),
        eligible_time=r.time("eligible", t),
        start_time=r.time("start", t),
        end_time=r.time("end", t),
        elapsed_s=r.int_or_none("elapsed", t) or 0,
        exit=_db_exit(r, "exit_code", r.obj),
        batch_exit=batch_exit,
        batch_state=batch_state,
        working_directory=r.text("working_directory"),
    )


def parse_queued_jobs(text: str, command: str, user: str | None = None) -> tuple[list[QueuedJob], list[DocumentError]]:
    """Jobs and errors of a `squeue --json` (or GET /slurm/v0.0.38/jobs) document. Raises SlurmBadOutput."""
    doc = load_document(text, command, user)
    errors = document_errors(doc, command, user)
    return _parse_each(_jobs(doc, command, user), _queued, command, user), errors


def parse_accounted_jobs(text: str, command: str,
                         user: str | None = None) -> tuple[list[AccountedJob], list[DocumentError]]:
    """Attempts and errors of a `sacct --json` (or GET /slurmdb/v0.0.38/jobs) document. Raises SlurmBadOutput."""
    doc = load_document(text, command, user)
    errors = document_errors(doc, command, user)
    return _parse_each(_jobs(doc, command, user), _accounted, command, user), errors


START_FORMAT = "%i|%S|%Y|%r"
"""The `squeue --start -o` format parse_start_estimates reads; times must be printed as epoch seconds
(SLURM_TIME_FORMAT=%s), so that no local time zone is guessed."""


def parse_start_estimates(text: str, command: str, user: str | None = None) -> list[StartEstimate]:
    """Rows of `squeue --start --noheader -o START_FORMAT`. Raises SlurmBadOutput."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 4 or not parts[0].strip().isdigit():
            raise SlurmBadOutput(command, f"line {n} is not 'id|start|nodes|reason': {line[:80]!r}", user)
        job_id, start, nodes, reason = (p.strip() for p in parts)
        when = None
        if start.isdigit() and int(start) > 0:
            when = datetime.fromtimestamp(int(start), UTC)
        elif start not in ("N/A", "Unknown", "0", ""):
            raise SlurmBadOutput(command, f"line {n}: start {start!r} is not epoch seconds (SLURM_TIME_FORMAT=%s)",
                                 user)
        out.append(StartEstimate(job_id=SlurmJobId(int(job_id)), start_time=when,
                                 nodes=None if nodes in ("", "(null)", "N/A") else nodes, reason=reason))
    return out
