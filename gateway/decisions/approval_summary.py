"""What an approval request would do, in words (M2: the second person approves what they see).

One function, `summarize`, turns a request (approvals.to_json), the facts as they stood when it was asked and
as they stand now (gateway/decisions/approval_facts.py gathers both) into what the console, the CLI, the API's `summary`
field and the notice to the approver all show:

1. the action in a line (`what`);
2. every parameter as before → after, per target where it is a target's (priority 520 → 900, running → stopped
   with its grace window, a quota's GPUs and period, a deletion's objects and recovery window, an emergency
   stop's scope, grace and hold); "before" is the value when the request was made, and where it differs now the
   change says so;
3. the exact targets (details only of jobs the viewer may see, A1), the blast radius, reason, requester and
   expiry;
4. who must still approve, as a sentence ("one more: alice, or a queue admin or on-call in vision").

Pure: no database, no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

ARROW = "→"

# How a role reads in "still needed", in the order a sentence names them.
ROLE_WORDS = {"queue_admin": "a queue admin", "oncall": "on-call", "platform_admin": "a platform admin",
              "security_reviewer": "a security reviewer", "auditor": "an auditor", "researcher": "a researcher"}
COUNT_WORDS = {1: "one more", 2: "two more", 3: "three more", 4: "four more"}
QUOTA_FIELDS = (("gpus", "GPUs"), ("borrow_limit", "borrow limit"), ("lend_limit", "lend limit"),
                ("users", "user limits"))

Facts = Mapping[str, Any]


def number(value: Any) -> str:
    """570.05, not 570.0491041888889; 900, not 900.0. Anything else as text."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "none" if value is None else str(value)
    rounded = round(float(value), 2)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.2f}".rstrip("0")


def duration(seconds: float) -> str:
    """`30 s`, `10 min`, `2 h`, `7 days`."""
    s = float(seconds)
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= size and s % size == 0:
            n = int(s // size)
            return f"{n} {'day' if unit == 'days' and n == 1 else unit}"
    return f"{number(s)} s"


def moment(value: str | datetime | None) -> str:
    """`2026-12-01 21:06:34 UTC` from an ISO timestamp (or a datetime)."""
    if value is None:
        return "-"
    at = value if isinstance(value, datetime) else _parse(value)
    return at.strftime("%Y-%m-%d %H:%M:%S UTC") if at is not None else str(value)


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _join(words: Sequence[str], last: str = "or") -> str:
    if len(words) <= 1:
        return "".join(words)
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


def still_needed(required: Mapping[str, Any], *, requester: str | None = None) -> str:
    """`one more: alice, or a queue admin or on-call in vision (not carol, who asked)`; `none` when complete.

    `*` among the projects means a role bound cluster-wide counts too; it is said only when no project is named.
    """
    count = int(required.get("count") or 0)
    if count <= 0:
        return "none"
    people = [str(p) for p in required.get("principals") or []]
    order = list(ROLE_WORDS)
    roles = sorted((str(r) for r in required.get("roles") or []),
                   key=lambda r: (order.index(r) if r in order else len(order), r))
    projects = [str(p) for p in required.get("projects") or [] if p != "*"]
    anyone = _join([ROLE_WORDS.get(r, "a " + r.replace("_", " ")) for r in roles])
    if anyone and projects:  # "*" alone: a role held anywhere counts, which needs no words
        anyone += f" in {_join(projects, 'and')}"
    who = ", or ".join(x for x in (", ".join(people), anyone) if x) or "a second person"
    text = f"{COUNT_WORDS.get(count, f'{count} more')}: {who}"
    return text + (f" (not {requester}, who asked)" if requester else "")


def _target_label(job_id: str, facts: Facts | None) -> str:
    if not facts:
        return f"job {job_id}"
    return f"job {job_id} ({facts.get('name') or 'unnamed'}, owner {facts.get('owner') or '-'})"


def _change(target: str | None, parameter: str, before: Any, after: Any, text: str, *,
            now: Any = None, changed: bool = False, now_text: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"target": target, "parameter": parameter, "before": before, "after": after,
                           "changed_since": changed, "text": text}
    if changed:
        out["now"] = now
        out["text"] = f"{text} ({now_text})" if now_text else text
    return out


def _stop_terms(facts: Facts | None) -> str:
    if not facts or facts.get("grace_seconds") is None:
        return ""
    if facts.get("state") == "pending":
        return "; it has not started, so no process is signalled"
    grace = float(facts["grace_seconds"])
    signal = facts.get("stop_signal") or "SIGTERM"
    return (f"; {signal}, then {duration(grace)} to checkpoint before SIGKILL" if grace > 0
            else f"; {signal} and SIGKILL at once (no grace)")


# What each target-changing action does to a job's state, and the words after the arrow.
STATE_AFTER = {
    "job.stop": ("stopped", ""),
    "job.resume": ("pending", "; back in its queue with its priority and the wait it had"),
    "job.confirm_stopped": ("stopped", "; a person vouches that its processes are gone, and its GPUs are released"),
    "job.delete": ("deleted", ""),
    "emergency.stop": ("stopped", ""),
}


def _job_changes(request: Mapping[str, Any], asked: Facts, now: Facts,
                 visible: set[str] | None) -> list[dict[str, Any]]:
    action, params = request["action"], request.get("params") or {}
    out: list[dict[str, Any]] = []
    asked_t, now_t = asked.get("targets") or {}, now.get("targets") or {}
    for job_id in request.get("targets") or []:
        was, is_ = asked_t.get(job_id), now_t.get(job_id)
        project = (was or is_ or {}).get("project")
        if visible is not None and project not in visible:
            continue  # a job the viewer may not see: its id and project are in `targets`, nothing more
        label = _target_label(job_id, was or is_)
        if action == "job.priority" and "priority" in params:
            before = (was or {}).get("priority")
            current = (is_ or {}).get("priority")
            changed = before is not None and current is not None and round(current, 2) != round(before, 2)
            shown = number(before) if before is not None else "not recorded"
            out.append(_change(job_id, "priority", before, params["priority"],
                               f"{label}: priority {shown} {ARROW} {number(params['priority'])}",
                               now=current, changed=changed,
                               now_text=f"it was {shown} when asked and is {number(current)} now"))
        elif action == "job.undelete":
            before, after = "deleted", (asked.get("deletions") or {}).get(job_id, {}).get("state_before", "restored")
            until = (asked.get("deletions") or {}).get(job_id, {}).get("purge_after")
            state = (is_ or {}).get("state")
            out.append(_change(job_id, "state", before, after,
                               f"{label}: {before} {ARROW} {after}; its files stay"
                               + (f" (its recovery window ends {moment(until)})" if until else ""),
                               now=state, changed=state is not None and state != before,
                               now_text=f"it is {state} now"))
        elif action in STATE_AFTER:
            after, how = STATE_AFTER[action]
            before = (was or {}).get("state")
            state = (is_ or {}).get("state")
            if action == "job.stop":  # an emergency stop's own grace (stated once, above) applies to all its jobs
                how = _stop_terms(is_ or was)
            shown = before or "not recorded"
            out.append(_change(job_id, "state", before, after, f"{label}: {shown} {ARROW} {after}{how}",
                               now=state, changed=before is not None and state is not None and state != before,
                               now_text=f"it was {shown} when asked and is {state} now"))
    return out


def _files(asked: Facts, request: Mapping[str, Any], visible: set[str] | None) -> list[dict[str, Any]]:
    """A6: what a deletion removes once its recovery window ends, and that window."""
    out: list[dict[str, Any]] = []
    for job_id in request.get("targets") or []:
        facts = (asked.get("targets") or {}).get(job_id) or {}
        if visible is not None and facts.get("project") not in visible:
            continue
        checkpoints = [str(c) for c in facts.get("checkpoints") or []]
        nodes = [str(n) for n in facts.get("file_nodes") or []]
        where = f" on {_join(nodes, 'and')}" if nodes else ""
        listed = (f"checkpoints {', '.join(checkpoints)} and every other file of the job{where}" if checkpoints
                  else f"every file of the job{where}")
        out.append(_change(job_id, "objects", "kept", "removed",
                           f"job {job_id}'s objects: {listed}: kept {ARROW} removed after the recovery window"))
    return out


def _window(asked: Facts, now: Facts) -> dict[str, Any]:
    days, current = asked.get("recovery_window_days"), now.get("recovery_window_days")
    shown = duration(float(days) * 86400) if days is not None else "not recorded"
    changed = days is not None and current is not None and int(current) != int(days)
    return _change(None, "recovery window", None, days,
                   f"recovery window: {shown} from the approval, in which `jobgate job undelete` restores the job",
                   now=current, changed=changed,
                   now_text=f"{shown} when asked; the policy now says {duration(float(current or 0) * 86400)},"
                            " which is what the deletion gets")


def _quota_value(key: str, value: Any) -> str:
    if key == "users":
        return ", ".join(f"{u} {number(v)} GPUs" for u, v in sorted((value or {}).items())) or "none"
    if value is None:
        return "unlimited" if key in ("borrow_limit", "lend_limit") else "none"
    return f"{number(value)} GPUs"


def _quota_text(whose: str, key: str, name: str, old: str, new: str) -> str:
    """`quota of vision: 8 → 16 GPUs`, `quota of vision: borrow limit unlimited → 0 GPUs`."""
    if key == "gpus":
        return f"{whose}: {old.removesuffix(' GPUs')} {ARROW} {new}"
    return f"{whose}: {name} {old} {ARROW} {new}"


def _period(values: Mapping[str, Any] | None) -> str:
    if not values:
        return "none"
    start, end = values.get("effective_from"), values.get("effective_until")
    return (f"from {moment(start)}" if start else "from when it is applied") + (
        f" until {moment(end)}" if end else ", no end")


def _quota_changes(request: Mapping[str, Any], now: Facts) -> list[dict[str, Any]]:
    """A7: each quota field before → after, and its effective period; "before" is what the request recorded."""
    params = request.get("params") or {}
    before = params.get("before") if isinstance(params.get("before"), dict) else None
    current = now.get("quota")
    project = request.get("project")
    whose = "the cluster's hard cap" if project == "*" else f"quota of {project}"
    out = []
    for key, name in QUOTA_FIELDS:
        if key not in params:
            continue
        old = before.get(key) if before else None
        if before is not None and old == params[key]:
            continue
        is_ = current.get(key) if current else None
        out.append(_change(None, key, old, params[key],
                           _quota_text(whose, key, name, _quota_value(key, old) if before else "none",
                                       _quota_value(key, params[key])),
                           now=is_, changed=is_ != old,
                           now_text=f"it is {_quota_value(key, is_) if current else 'none'} now"))
    if "effective_from" in params or "effective_until" in params:
        old_p, new_p = _period(before), _period(params)
        changed = _period(current) != old_p
        out.append(_change(None, "period", old_p, new_p, f"{whose}: period {old_p} {ARROW} {new_p}",
                           now=_period(current), changed=changed, now_text=f"it is {_period(current)} now"))
    return out


def _emergency(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    scope = params.get("scope") or {}
    grace = float(params.get("grace_seconds") or 0)
    where = f"{scope.get('kind')}={scope.get('value')}" if scope else "-"
    hold = bool(params.get("hold"))
    return [
        _change(None, "scope", None, where, f"scope: {where} ({params.get('trigger') or 'unstated'} concern)"),
        _change(None, "grace", None, grace,
                f"grace: {duration(grace)} to checkpoint, then SIGKILL" if grace > 0
                else "grace: none, every job is killed at once"),
        _change(None, "hold", "open", "held" if hold else "open",
                f"hold: the scope open {ARROW} closed: new jobs and resumes there are refused until the stop is lifted"
                if hold else "hold: none; new jobs may be submitted to the scope at once"),
    ]


def _breakglass(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    projects = ", ".join(params.get("projects") or []) or "-"
    actions = ", ".join(params.get("actions") or []) or "-"
    uses = params.get("max_uses")
    return [_change(None, "grant", "none", "active",
                    f"break-glass grant: none {ARROW} {actions} in {projects} for "
                    f"{duration(float(params.get('duration_seconds') or 0))}, {_plural(int(uses or 0), 'use')}")]


def _other(params: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [_change(None, str(k), None, v, f"{k}: {v}") for k, v in sorted(params.items()) if k != "blast_radius"]


def _what(request: Mapping[str, Any], changes: Sequence[Mapping[str, Any]], asked: Facts) -> str:
    action, params, ids = request["action"], request.get("params") or {}, request.get("targets") or []
    jobs = f"job {ids[0]}" if len(ids) == 1 else _plural(len(ids), "job")
    if action == "job.priority" and "priority" in params:
        if len(ids) == 1 and changes:
            return f"set the priority of {jobs} from {number(changes[0]['before'])} to {number(params['priority'])}"
        return f"set the priority of {jobs} to {number(params['priority'])}"
    if action == "quota.change":
        return "; ".join(c["text"].split(" (")[0] for c in changes) or f"quota of {request.get('project')}: no change"
    if action == "emergency.stop":
        scope = params.get("scope") or {}
        return (f"emergency stop of {scope.get('kind')}={scope.get('value')} ({params.get('trigger')} concern):"
                f" {jobs}, " + (f"{duration(float(params['grace_seconds']))} grace" if params.get("grace_seconds")
                                else "no grace")
                + (", then a hold on the scope" if params.get("hold") else ""))
    if action == "job.delete":
        days = asked.get("recovery_window_days")
        return f"delete {jobs} and, after a {duration(float(days) * 86400)} recovery window, its files" if days \
            else f"delete {jobs} and its files after the recovery window"
    if action == "breakglass.request":
        return changes[0]["text"] if changes else "a break-glass grant"
    verbs = {"job.stop": "stop", "job.resume": "resume", "job.confirm_stopped": "confirm as stopped",
             "job.undelete": "restore (undelete)"}
    if action in verbs:
        return f"{verbs[action]} {jobs}"
    return f"{action} on {jobs}" if ids else action


def _short(request: Mapping[str, Any], changes: Sequence[Mapping[str, Any]], what: str) -> str:
    """`priority 520 → 900`: the change alone, for a row beside the target ids (a list, a table)."""
    params, ids = request.get("params") or {}, request.get("targets") or []
    if request["action"] == "job.priority" and "priority" in params:
        if len(ids) == 1 and changes and changes[0].get("parameter") == "priority":
            return f"priority {number(changes[0]['before'])} {ARROW} {number(params['priority'])}"
        return f"priority {ARROW} {number(params['priority'])} on {_plural(len(ids), 'job')}"
    return what.replace(f"job {ids[0]}", "1 job") if len(ids) == 1 else what


def _radius(request: Mapping[str, Any], asked: Facts, visible: set[str] | None) -> str:
    """`3 jobs, 2 running, 16 GPUs, 41.5 GPU-hours at stake, projects speech, vision; owners alice`."""
    given = request.get("blast_radius") or {}
    targets = [(asked.get("targets") or {}).get(t) or {} for t in request.get("targets") or []]
    if not request.get("targets"):
        return "no jobs"
    jobs = int(given.get("jobs", len(targets)))
    gpus = given.get("gpus", sum(int(t.get("gpus") or 0) for t in targets))
    projects = given.get("projects") or sorted({str(t["project"]) for t in targets if t.get("project")})
    parts = [_plural(jobs, "job")]
    if "running" in given:
        parts.append(f"{given['running']} running")
    parts.append(_plural(int(gpus), "GPU"))
    if given.get("gpu_hours_at_stake"):
        parts.append(f"{number(given['gpu_hours_at_stake'])} GPU-hours at stake")
    text = ", ".join(parts) + (f" in {'project' if len(projects) == 1 else 'projects'} {', '.join(projects)}"
                               if projects else "")
    owners = sorted({str(t["owner"]) for t in targets if t.get("owner")
                     and (visible is None or t.get("project") in visible)})
    return text + (f"; {'owner' if len(owners) == 1 else 'owners'} {', '.join(owners)}" if owners else "")


def _targets(request: Mapping[str, Any], asked: Facts, now: Facts, visible: set[str] | None) -> list[dict[str, Any]]:
    out = []
    for job_id in request.get("targets") or []:
        facts = {**((asked.get("targets") or {}).get(job_id) or {})}
        current = (now.get("targets") or {}).get(job_id) or {}
        project = facts.get("project") or current.get("project")
        if visible is not None and project not in visible:
            out.append({"id": job_id, "project": project, "hidden": True})
            continue
        out.append({"id": job_id, "project": project, "name": facts.get("name") or current.get("name"),
                    "owner": facts.get("owner") or current.get("owner"), "gpus": facts.get("gpus"),
                    "state_when_asked": facts.get("state"), "state": current.get("state")})
    return out


def _requested_by(request: Mapping[str, Any]) -> str:
    who = str(request.get("requester"))
    real = request.get("requester_real")
    return who + (f" (for {real})" if real and real != who else "")


def _expiry(request: Mapping[str, Any], clock: datetime) -> str:
    at = _parse(request.get("expires_at"))
    if at is None:
        return "-"
    left = (at - clock).total_seconds()
    if request.get("state") != "pending":
        return f"{moment(at)} (it is {request.get('state')})"
    if left <= 0:
        return f"{moment(at)} (expired)"
    return f"{moment(at)} (in {duration(max(60.0, round(left / 60) * 60))})"


def _closed(request: Mapping[str, Any]) -> str:
    state = request.get("state")
    by = f" by {request['resolved_by']}" if request.get("resolved_by") else ""
    return f"nothing more: {state} at {moment(request.get('resolved_at'))}{by}"


def summarize(request: Mapping[str, Any], asked: Facts, now: Facts, *, clock: datetime,
              visible: set[str] | None = None) -> dict[str, Any]:
    """The request in words. `request`: approvals.to_json; `asked` / `now`: the facts when it was made and now
    (approval_facts); `visible`: the projects whose jobs the viewer may see (None: all). Raises nothing."""
    action, params = request["action"], request.get("params") or {}
    changes = _job_changes(request, asked, now, visible)
    if action == "job.delete":
        changes += [*_files(asked, request, visible), _window(asked, now)]
    elif action == "quota.change":
        changes = _quota_changes(request, now)
    elif action == "emergency.stop":
        changes = _emergency(params) + changes
    elif action == "breakglass.request":
        changes = _breakglass(params)
    elif not changes:
        changes = _other(params)
    hidden = [t for t in request.get("targets") or [] if visible is not None
              and ((asked.get("targets") or {}).get(t) or (now.get("targets") or {}).get(t) or {}).get("project")
              not in visible]
    if hidden:
        changes.append(_change(None, "hidden targets", None, None,
                               f"{_plural(len(hidden), 'more job')} of projects you may not view: {', '.join(hidden)}"))
    needed = (still_needed(request.get("required") or {}, requester=request.get("requester_real"))
              if request.get("state") == "pending" else _closed(request))
    what = _what(request, changes, asked)
    out = {
        "what": what,
        "short": _short(request, changes, what),
        "changes": changes,
        "targets": _targets(request, asked, now, visible),
        "blast_radius": _radius(request, asked, visible),
        "reason": request.get("reason"),
        "ticket": request.get("ticket"),
        "requester": _requested_by(request),
        "requested_at": moment(request.get("created_at")),
        "expires": _expiry(request, clock),
        "still_needed": needed,
        "recorded_when_asked": bool(asked),
    }
    out["lines"] = lines(out)
    return out


def lines(summary: Mapping[str, Any]) -> list[str]:
    """The summary as the lines a person reads (CLI, notice), each one complete."""
    out = [f"what: {summary['what']}"]
    out += [f"  {c['text']}" for c in summary["changes"]]
    out.append(f"blast radius: {summary['blast_radius']}")
    reason = summary.get("reason")
    out.append(f"reason: {reason if reason else '-'}" + (f" (ticket {summary['ticket']})" if summary.get("ticket")
                                                        else ""))
    out.append(f"requested by {summary['requester']} at {summary['requested_at']}")
    out.append(f"expires {summary['expires']}")
    out.append(f"still needed: {summary['still_needed']}")
    if not summary.get("recorded_when_asked"):
        out.append("(asked before jobgate kept the values at the time of a request: no before values)")
    return out


def sentence(summary: Mapping[str, Any]) -> str:
    """The summary as one paragraph, for a notice: `You are asked to confirm: set the priority of ...`."""
    changes = "; ".join(c["text"] for c in summary["changes"])
    reason = summary.get("reason") or "none given"
    return (f"You are asked to confirm: {summary['what']}" + (f" ({changes})" if changes else "")
            + f". Blast radius: {summary['blast_radius']}. Reason: {reason}"
            + (f" (ticket {summary['ticket']})" if summary.get("ticket") else "")
            + f". Requested by {summary['requester']}; expires {summary['expires']}."
            + f" Still needed: {summary['still_needed']}.")
