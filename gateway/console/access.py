"""Who may open which console page, and what the navigation offers: one check per page, used both by the page
(which refuses with it) and by every link to it (shown only where that check passes), so the console never
shows someone a link it then answers 403."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from sqlalchemy.orm import Session

from gateway.console.sessions import ConsoleSession
from gateway.context import Gateway
from gateway.decisions.pipeline import decide
from gateway.decisions.verdict import refuse_unless_allowed
from gateway.errors import Forbidden
from gateway.identity.auth import Caller
from gateway.jobs import emergency


class View(Protocol):
    """What a page check reads of the signed-in request (gateway/console/web.py's View)."""

    gw: Gateway
    cs: ConsoleSession

    def caller(self, session: Session) -> Caller: ...

    def capabilities(self) -> frozenset[str]: ...


PageCheck = Callable[[View], None]

# Cluster-wide views are for people holding an operator capability everywhere (platform admin, on-call, security
# reviewer); /v1/stats/* asks the same.
ADMIN_CAPABILITIES = frozenset({"quota.change", "role.manage", "emergency.stop", "job.pause.any"})


def operator(view: View) -> None:
    """The check of /ui/admin. Raises Forbidden naming what is missing."""
    if not view.capabilities() & ADMIN_CAPABILITIES:
        raise Forbidden(f"{view.cs.principal} may not see cluster administration data"
                        f" (needs one of {', '.join(sorted(ADMIN_CAPABILITIES))} in every project)")


def ledger_reader(view: View) -> None:
    """The check of /ui/ledger and of GET /v1/ledger/*: the policy decides `ledger.read`. Raises PolicyDenied."""
    with view.gw.transaction(immediate=False) as session:
        refuse_unless_allowed(decide(view.gw, session, view.caller(session), "ledger.read", record=False))


def emergency_viewer(view: View) -> None:
    """The check of /ui/emergency (a decider of one stop may also open that stop's own page). Raises Forbidden."""
    with view.gw.transaction(immediate=False) as session:
        emergency.may_view(view.gw, view.caller(session), None)


def may(view: View, check: PageCheck) -> bool:
    """Whether `check` lets this person in: the page's own answer, asked before showing a link to it."""
    try:
        check(view)
    except Forbidden:
        return False
    return True


# The pages in the header, by who tends to need them; None: a page everyone signed in may open.
NAV: tuple[tuple[str, str, PageCheck | None], ...] = (
    ("/ui/", "My jobs", None),
    ("/ui/approvals", "Approvals", None),
    ("/ui/admin", "Admin", operator),
    ("/ui/emergency", "Emergency stops", emergency_viewer),
    ("/ui/policy", "Policy", None),
    ("/ui/ledger", "Ledger", ledger_reader),
)


CHECKS: dict[str, PageCheck | None] = {href: check for href, _, check in NAV}
