"""How the console says things to people: numbers rounded (570.05, not 570.0491041888889), times to the second in
UTC, lists and records as words rather than Python's reprs, an exit status that may be unknown, and each notice
as a sentence. Pure functions of the values they are given; the templates use them as filters."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

NONE = "–"


def number(value: Any, places: int = 2) -> str:
    """A figure for people: integers as they are, other numbers rounded to `places` decimals without trailing
    zeros; anything else as words."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return words(value)
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        return str(value)
    text = f"{value:.{places}f}".rstrip("0").rstrip(".") if places > 0 else f"{value:.0f}"
    return "0" if text in ("-0", "") else text


def _as_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and value[10:11] == "T":
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def when(value: Any) -> str:
    """A moment as `2026-11-29 10:00:05 UTC` (a datetime or an ISO 8601 string); NONE for none."""
    at = _as_time(value)
    if at is None:
        return NONE if value is None else str(value)
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def duration(seconds: Any) -> str:
    """`45 s`, `12 min`, `2 h 30 min`, `3 d 4 h`: a length of time for people."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return words(seconds)
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        m, rest = divmod(s, 60)
        return f"{m} min" + (f" {rest} s" if rest and m < 10 else "")
    if s < 86400:
        h, rest = divmod(s, 3600)
        return f"{h} h" + (f" {rest // 60} min" if rest // 60 else "")
    d, rest = divmod(s, 86400)
    return f"{d} d" + (f" {rest // 3600} h" if rest // 3600 else "")


def exit_status(code: Any) -> str:
    """`exit code 3`, or, when no node saw one (the process was gone before it could be read), says so."""
    return f"exit code {code}" if isinstance(code, int) and not isinstance(code, bool) else "exit status unknown"


def label(key: str) -> str:
    """A field name as words: `stop_latency_s` → `stop latency s`."""
    return key.replace("_", " ")


def words(value: Any) -> str:
    """Any value of a record (JSON-like) as words: none, yes/no, rounded numbers, times, lists joined with
    commas, records as `key value; key value`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        return number(value)
    if isinstance(value, datetime) or _as_time(value) is not None:
        return when(value)
    if isinstance(value, Mapping):
        return "; ".join(f"{label(str(k))} {words(v)}" for k, v in value.items()) or "none"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(words(v) for v in value) or "none"
    return str(value)


# -- notices ---------------------------------------------------------------------------------------------------

_VERBS = {"job.stop": "is stopping", "job.pause": "is pausing", "job.priority": "is changing the priority of",
          "job.delete": "is deleting", "job.resume": "is resuming", "job.preempt": "is preempting"}
_NOUNS = {"job.stop": "a stop", "job.pause": "a pause", "job.priority": "a priority change",
          "job.delete": "a deletion", "job.undelete": "an undeletion", "job.resume": "a resume",
          "quota.change": "a quota change", "emergency.stop": "an emergency stop",
          "job.confirm_stopped": "a confirmation that a job no longer runs",
          "breakglass.request": "a break-glass grant"}


class _Body:
    """A notice's body, remembering which fields a sentence used so the rest can follow it as words."""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self.body, self.used = body, set[str]()

    def __getitem__(self, key: str) -> Any:
        self.used.add(key)
        return self.body.get(key)

    def rest(self) -> str:
        left = {k: v for k, v in self.body.items() if k not in self.used and v not in (None, "", [], {})}
        return f" ({words(left)})" if left else ""


def _quoted(text: Any) -> str:
    return f": “{text}”" if text else ""


def _job(b: _Body) -> str:
    name = b["job_name"]
    return f"{name} ({b['job_id']})" if name else str(b["job_id"])


def _action(b: _Body) -> str:
    action = b["action"]
    return _NOUNS.get(str(action), str(action))


def _checkpoint(value: Any) -> str:
    if isinstance(value, Mapping):
        files = [f.get("path", "") for f in value.get("files") or [] if isinstance(f, Mapping)]
        if files:
            return f"{len(files)} checkpoint file{'s' if len(files) != 1 else ''} kept ({', '.join(files)})"
        return "no checkpoint written"
    return words(value)


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]) if text else text


def _sentences(*texts: Any) -> str:
    """Each non-empty text as a sentence of its own, capitalised and ended with one full stop."""
    return " ".join(_sentence(str(t)).rstrip(".") + "." for t in texts if t)


def _preempted(b: _Body) -> str:
    by = f" by {b['preemptor']}" if b["preemptor"] else ""
    of = f" of project {b['preemptor_project']}" if b["preemptor_project"] else ""
    kind = {"reclaim": "its lender reclaims the GPUs it borrowed", "priority": "a higher-priority job needs its GPUs"}
    why = kind.get(str(b["kind"]), words(b["kind"]))
    return _sentences(f"Your job {_job(b)} is being preempted{by}{of} ({why}){_quoted(b['reason'])}",
                      b["checkpoint"], b["expected_restart"])


def _requeued(b: _Body) -> str:
    return _sentences(f"Your job {_job(b)} is back in its queue after its preemption ({words(b['outcome'])} exit),"
                      f" with priority {number(b['priority'])}; {_checkpoint(b['checkpoint'])}", b["expected_restart"])


def _expected_restart(b: _Body) -> str:
    if b["placed"]:
        return f"Your job {_job(b)} was placed again{_quoted(b['reason'])}."
    at = b["expected_restart"]
    start = f"is expected to start at {when(at)}" if at else "starts once the GPUs it needs are free"
    return (f"Your job {_job(b)} waits at position {words(b['position'])} in the {words(b['queue'])} queue and {start}"
            f"{_quoted(b['reason'])}.")


SENTENCES: dict[str, Callable[[_Body], str]] = {
    "job_action": lambda b: f"{b['by']} {_VERBS.get(str(b['action']), 'acts on')} your job {_job(b)}"
                            f"{_quoted(b['reason'])}.",
    "preempted": _preempted,
    "requeued": _requeued,
    "expected_restart": _expected_restart,
    "renewal_due": lambda b: f"Your job {_job(b)} has held its GPUs for the longest continuous time allowed: renew it"
                             f" by {when(b['renew_by'])} ({b['how']}), or it is stopped gracefully and requeued.",
    "job_runtime_limit": lambda b: f"Your job {_job(b)} ran past its declared runtime limit of"
                                   f" {duration(b['runtime_limit_s'])} (it started {when(b['started_at'])}): the"
                                   " system is stopping it gracefully.",
    "job_auto_offline": lambda b: f"Your job {_job(b)} reached the end of its validity period"
                                  f" ({when(b['valid_until'])}) and is being taken offline.",
    "job_gang_member_failed": lambda b: f"A member of your job {_job(b)} failed on {b['node']}"
                                        f" ({exit_status(b['exit_code'])}); the system is stopping the others"
                                        f"{' on ' + words(b['stopping']) if b['stopping'] else ''}.",
    "start_not_delivered": lambda b: f"Your job {_job(b)}: {b['reason'] or 'its start did not reach its node'}.",
    "job_paused": lambda b: f"{b['by']} paused your job {_job(b)}{_quoted(b['reason'])}.",
    "job_resumed": lambda b: f"{b['by']} resumed your job {_job(b)}{_quoted(b['reason'])}.",
    "job_confirmed_stopped": lambda b: f"{b['by']} confirmed that your job {_job(b)} no longer runs"
                                       f"{_quoted(b['reason'])}.",
    "approval_requested": lambda b: f"{b['requester']} asks for {_action(b)} of {words(b['targets'])}, which needs a"
                                    f" second person{_quoted(b['reason'])}. Request {b['approval_id']}, open until"
                                    f" {when(b['expires_at'])}.",
    "approval_executed": lambda b: f"Your request {b['approval_id']} ({_action(b)}) was approved and carried out"
                                   f"{'; skipped: ' + words(b['skipped']) if b['skipped'] else ''}.",
    "approval_rejected": lambda b: f"Request {b['approval_id']} ({_action(b)}) was turned down by {b['by']}"
                                   f"{_quoted(b['reason'])}; nothing was done.",
    "approval_expired": lambda b: f"Request {b['approval_id']} ({_action(b)}) expired at {when(b['expired_at'])}"
                                  " with nothing done.",
}


def notice(kind: str, body: Mapping[str, Any]) -> str:
    """One notice as a sentence. Fields a kind's sentence does not use, and every field of a kind without its own
    sentence (on-call's alerts), follow as words, so nothing the notice holds is left out."""
    b = _Body(body)
    make = SENTENCES.get(kind)
    if make is None:
        return f"{_sentence(label(kind))}: {words(dict(body))}."
    try:
        text = make(b)
    except (AttributeError, TypeError, ValueError):  # a body of another shape (an older gateway's): its fields
        return f"{_sentence(label(kind))}: {words(dict(body))}."
    return text + b.rest()
