"""Plumbing shared by the console's pages: templates, the signed-in view, CSRF, HTML error pages."""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.orm import Session
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.console import access, wording
from gateway.console.sessions import COOKIE, ConsoleSession, SessionStore, caller_for, csrf_ok
from gateway.context import Gateway
from gateway.decisions import attempts, refusals
from gateway.errors import Forbidden, GatewayError, Unauthenticated
from gateway.identity.auth import Caller

templates = Jinja2Templates(directory=Path(__file__).resolve().parent / "templates")
# Values as people read them (gateway/console/wording.py): `{{ x | num }}`, `{{ t | when }}`, `{{ v | words }}`.
templates.env.filters.update(num=wording.number, when=wording.when, words=wording.words, duration=wording.duration,
                             exit_status=wording.exit_status, label=wording.label)
templates.env.globals["notice"] = wording.notice
P = ParamSpec("P")

# Every /ui response. The pages run no script at all, so a script that slipped past escaping does not run;
# no other site may frame them (a framed approve or stop button can be clicked by a visitor who is tricked
# into it); and a signed-in page is not kept in the browser's cache after sign-out.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self';"
                               " frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class ConsoleHeadersMiddleware:
    """Adds SECURITY_HEADERS to every response under /ui: pages, redirects, and the errors and 404s that no
    page handler returns (a route class would miss those)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != "/ui" and not path.startswith("/ui/"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


def store(request: Request) -> SessionStore:
    app_state = request.app.state
    existing: SessionStore | None = getattr(app_state, "console_sessions", None)
    if existing is None:
        existing = SessionStore(app_state.gateway.transaction)
        app_state.console_sessions = existing
    return existing


def source(request: Request) -> dict[str, Any]:
    return {"ip": request.client.host if request.client else None,
            "user_agent": request.headers.get("user-agent", ""), "script": False, "via": "console",
            "request_id": request.headers.get("x-request-id")}


@dataclass
class View:
    """A signed-in console request."""

    request: Request
    gw: Gateway
    cs: ConsoleSession
    checked: dict[str, bool] = field(default_factory=dict)  # may_open's answers for this request

    def caller(self, session: Session) -> Caller:
        return caller_for(session, self.cs, self.gw.clock(), source(self.request))

    def capabilities(self) -> frozenset[str]:
        return self.gw.policy.capabilities(self.cs.principal, "*")

    def may_open(self, href: str) -> bool:
        """Whether the page at `href` (one of access.NAV's, a query string allowed) lets this person in, by that
        page's own check, asked once per request. Raises KeyError for a page NAV does not list."""
        path = href.split("?", 1)[0]
        if path not in self.checked:
            check = access.CHECKS[path]
            self.checked[path] = check is None or access.may(self, check)
        return self.checked[path]

    def require_csrf(self, given: str | None) -> None:
        """Raises Forbidden unless the form carried this session's CSRF token."""
        if not csrf_ok(self.cs.csrf, given):
            raise Forbidden("this form is missing its CSRF token or it is stale; reload the page and try again")

    def render(self, template: str, code: int = 200, **ctx: Any) -> HTMLResponse:
        nav = [(href, label) for href, label, _ in access.NAV if self.may_open(href)]
        return templates.TemplateResponse(self.request, template, {
            "me": self.cs.principal, "csrf": self.cs.csrf, "nav": nav, "path": self.request.url.path,
            "may_open": self.may_open, **ctx}, status_code=code)


def current(request: Request) -> View | None:
    gw: Gateway = request.app.state.gateway
    cs = store(request).get(request.cookies.get(COOKIE), gw.clock())
    return View(request, gw, cs) if cs else None


def to_login(request: Request) -> RedirectResponse:
    resp = RedirectResponse("/ui/login", status_code=303)
    resp.delete_cookie(COOKIE, path="/ui")
    return resp


def error_page(request: Request, view: View | None, err: GatewayError) -> HTMLResponse:
    ctx = {"title": err.title, "detail": err.detail, "status": err.status, "extra": err.extra}
    if view is not None:
        resp = view.render("error.html", code=err.status, **ctx)
    else:
        resp = templates.TemplateResponse(request, "error.html", {"me": None, "nav": [], "csrf": "", **ctx},
                                          status_code=err.status)
    resp.headers.update(err.headers)  # a 429's Retry-After, as the API sends it
    return resp


def page(fn: Callable[P, Response]) -> Callable[P, Response]:
    """Route decorator: no session → sign-in page; a GatewayError → an HTML page with its status and
    detail (the same refusal the API gives as problem+json), and in the ledger as the API's are."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Response:
        request = kwargs.get("request")
        assert isinstance(request, Request), "console routes take `request` as a keyword"
        view = current(request)
        if view is None:
            return to_login(request)
        # No body: a console form carries its CSRF token. The page's decisions note themselves into it.
        attempt = attempts.begin(attempts.Attempt(request.method, attempts.route_of(request.scope),
                                                  dict(request.path_params), request.query_params.multi_items()))
        try:
            return fn(*args, **kwargs)
        except Unauthenticated:
            store(request).drop(view.cs.id)
            return to_login(request)
        except GatewayError as e:
            _ledger_refusal(view, attempt, e)
            return error_page(request, view, e)

    return wrapper


def _ledger_refusal(view: View, attempt: attempts.Attempt, e: GatewayError) -> None:
    """A signed-in person's refusal, named by their session's token (gateway/decisions/refusals.py). Raises nothing."""
    if not refusals.is_refusal(e) or attempt.ledgered:
        return
    try:
        with view.gw.transaction(immediate=False) as session:
            attempt.authenticated(view.caller(session))
    except Exception:  # signed out meanwhile, or the database is gone: nobody to name, the page says the rest
        return
    refusals.ledger_refusal_sync(view.gw, attempt, e)


def need_view(request: Request) -> View:
    """The View of a request already admitted by @page."""
    view = current(request)
    if view is None:  # @page checked this; a session dropped in between fails closed
        raise Unauthenticated("signed out")
    return view


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)
