"""A recorded decision turned into the caller's answer: go on on allow; otherwise the error its effect calls for
(403 policy, 429 or 503 for the calls-per-minute limit, 409 where no second person can be waited for)."""

from __future__ import annotations

from gateway.decisions.pipeline import Recorded
from gateway.decisions.ratelimit import RateBreach
from gateway.errors import Conflict, PolicyDenied, RateCountsUnavailable, RateLimited
from gateway.schemas import DecisionOut


def decision_out(rec: Recorded) -> DecisionOut:
    d = rec.decision
    return DecisionOut(
        effect=d.effect,
        reasons=list(d.reasons),
        rules=list(d.rules),
        approvals_required=dict(d.approvals_required),
        obligations=[dict(o) for o in d.obligations],
        policy_hash=d.policy_hash,
        ledger_seq=rec.seq,
    )


def refuse_if_denied(rec: Recorded) -> None:
    """Raise for a deny: RateLimited (429, Retry-After) for a used-up calls-per-minute limit,
    RateCountsUnavailable (503) when its counts cannot be read, PolicyDenied (403) for every other refusal, the
    blast-radius limits (jobs, projects, GPUs per call) among them: asking again later changes nothing there.
    Only for actions that open an approval when the answer is needs_approval; every other caller wants
    refuse_unless_allowed."""
    if rec.decision.effect != "deny":
        return
    detail = " ".join(rec.decision.reasons) or "denied by policy"
    recorded = {"reasons": list(rec.decision.reasons), "rules": list(rec.decision.rules), "ledger_seq": rec.seq,
                "policy_hash": rec.decision.policy_hash}
    if isinstance(rec.rate_refusal, RateBreach):
        raise RateLimited(detail, retry_after_s=rec.rate_refusal.retry_after_s, **recorded)
    if rec.rate_refusal is not None:
        raise RateCountsUnavailable(detail, **recorded)
    raise PolicyDenied(detail, **recorded)


def refuse_unless_allowed(rec: Recorded, what: str = "this request") -> None:
    """Go on only on allow: a deny raises PolicyDenied, and needs_approval raises Conflict, so that an action
    with no approval path is never carried out without the second person the policy asked for (M2). The
    default for every check, so that a rule a reviewer adds later fails closed where nobody expected it."""
    refuse_if_denied(rec)
    if rec.decision.effect != "allow":
        raise Conflict(f"{what} needs a second person ({' '.join(rec.decision.reasons)}); it cannot wait for an"
                       " approval, so nothing was changed", ledger_seq=rec.seq, rules=list(rec.decision.rules))
