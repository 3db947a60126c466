"""HTTP client used by the CLI: one place that turns transport and problem+json errors into one line."""

from __future__ import annotations

import json
import math
import os
import sys
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn
from urllib.parse import quote

import click
import httpx

DEFAULT_URL = "http://127.0.0.1:8080"
KEYED = frozenset({"POST", "PUT", "PATCH", "DELETE"})  # the methods the CLI sends an Idempotency-Key with


class ApiError(click.ClickException):
    """Printed by click as one line: `Error: <message>`, exit code 1."""


def fail(message: str) -> NoReturn:
    raise ApiError(message)


def _header_value(value: str, what: str) -> str:
    """VALUE without the spaces a paste leaves around it, fit for an HTTP header; raises ApiError otherwise
    (httpx would raise UnicodeEncodeError on non-ASCII, and h11's refusal of a trailing space or a line break
    read as an unreachable gateway, with the whole secret in the message). Never echoes it."""
    value = value.strip()
    if not (value.isascii() and value.isprintable()):
        fail(f"{what} must be printable ASCII, on one line")
    return value


def api_path(*segments: str | int) -> str:
    """`/v1/` and SEGMENTS, each percent-quoted whole, so that an id a user typed is one segment of the route its
    command names. Unquoted, httpx resolved `..` and `.` segments and took `?` and `#` as the start of a query or
    fragment: `jobgate emergency-stop show ../../v1/ledger/entries` read the ledger, and `jobgate reject
    ../jobs/J/stop#` stopped job J. A segment of dots is written as %2E, which no resolver takes for a dot segment
    and the gateway reads back as the dots. Raises ApiError for an empty segment (it would name the parent)."""
    parts = []
    for segment in map(str, segments):
        if not segment:
            fail("an id or name cannot be empty")
        parts.append("%2E" * len(segment) if segment in (".", "..") else quote(segment, safe=""))
    return "/v1/" + "/".join(parts)


class Client:
    """The gateway's HTTP API, for one command. Nothing is checked or opened before the first call, so that a
    `--gateway`, `--token` or `--trigger` written after the subcommand can still stand in for the group's (`but`).
    Raises ApiError (one line, exit 1) for a URL, token or trigger that cannot be sent, and from `request`."""

    def __init__(self, url: str, token: str | None, trigger: str | None = None, timeout: float = 30.0) -> None:
        self.given_url, self.token, self.trigger, self.timeout = url, token, trigger, timeout
        self.has_token = bool(token)
        self.url = url.rstrip("/")
        self._http: httpx.Client | None = None

    def but(self, **given: str | None) -> Client:
        """This client with the `gateway`, `token` or `trigger` given instead (named as the options are)."""
        return Client(given.get("gateway", self.given_url) or DEFAULT_URL, given.get("token", self.token),
                      given.get("trigger", self.trigger), self.timeout)

    @property
    def http(self) -> httpx.Client:
        """The HTTP client, opened on first use; closed when the command ends. Raises ApiError."""
        if self._http is None:
            self._http = self._open()
        return self._http

    def _open(self) -> httpx.Client:
        headers = {"User-Agent": "jobgate-cli"}
        if self.token:
            headers["Authorization"] = "Bearer " + _header_value(self.token, "the token (--token or JOBGATE_TOKEN)")
        if self.trigger:
            headers["X-Jobgate-Trigger"] = _header_value(self.trigger, "the trigger (--trigger or JOBGATE_TRIGGER)")
        try:
            parsed = httpx.URL(self.url)
        except httpx.InvalidURL as e:  # e.g. an unclosed [ of an IPv6 address
            fail(f"{self.given_url!r} is not a gateway URL (--gateway or JOBGATE_URL): {e}")
        if parsed.scheme not in ("http", "https") or not parsed.host:
            fail(f"{self.given_url!r} is not a gateway URL (--gateway or JOBGATE_URL): write it like http://HOST:PORT")
        http = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout)
        ctx = click.get_current_context(silent=True)
        if ctx is not None:  # close the kept-alive connection when the command ends, not at interpreter exit
            ctx.call_on_close(http.close)
        return http

    def request(self, method: str, *segments: str | int, options: Mapping[str, str] | None = None,
                **kwargs: Any) -> Any:
        """METHOD on the route `/v1/SEGMENTS` (see api_path: the path is only ever built from quoted segments, so
        no command can put an id into it raw); the JSON answer, or the text of any other. `options` names the
        command's option for each body field, so that a 422 speaks of `--runtime-limit`, not of the API's
        `runtime_limit_seconds`."""
        if method.upper() in KEYED:
            # One key per mutating call, kept for its one retry: the gateway answers that retry with the first answer,
            # so a connection lost after the request was sent never does the action twice (gateway/api/idempotency.py).
            kwargs["headers"] = {**kwargs.get("headers", {}), "Idempotency-Key": f'"{uuid.uuid4()}"'}
        try:
            built = self.http.build_request(method, api_path(*segments), **kwargs)
        except httpx.InvalidURL as e:  # api_path quotes every id; kept so that nothing else can end in a traceback
            fail(f"cannot send this request: an id or name in it holds a character no URL can carry ({e})")
        except ValueError as e:  # JSON has no NaN or infinity
            fail(f"cannot send this request: a value in it cannot be written as JSON ({e})")
        r = self._send(built)
        if r.status_code >= 400:
            fail(f"{r.status_code} {self._problem(r, options or {})}")
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text


    def _send(self, built: httpx.Request) -> httpx.Response:
        """Send, and once more on a connection error (refused, reset, closed before the answer): with the same
        Idempotency-Key, so that the gateway (or another replica) does nothing twice. A timeout is not retried: the
        first attempt may still be running, and would only be reported in flight. Raises ApiError."""
        for attempt in (1, 2):
            try:
                return self.http.send(built)
            except httpx.LocalProtocolError as e:  # its text may quote a header: the token
                fail(f"cannot send this request to {self.url} ({e.__class__.__name__}); check --token and --trigger")
            except (httpx.NetworkError, httpx.RemoteProtocolError) as e:
                if attempt == 2:  # (silent before: an error stays one line)
                    fail(f"cannot reach the gateway at {self.url} ({e.__class__.__name__}: {e})")
            except httpx.HTTPError as e:
                fail(f"cannot reach the gateway at {self.url} ({e.__class__.__name__}: {e})")
        raise AssertionError("unreachable")

    def _problem(self, r: httpx.Response, options: Mapping[str, str]) -> str:
        """One line from a problem+json answer: its detail, plus what a CLI user needs next (the rule that refused
        and the ledger seq the refusal is recorded at; where a missing token goes; the options, not the API
        fields, that a 422 is about)."""
        try:
            body = r.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return r.text.strip()[:300]
        detail = str(body.get("detail") or body.get("title") or "")
        errors = body.get("errors")
        if r.status_code == 422 and options and isinstance(errors, list) and errors:
            detail = "; ".join(_as_option(e, options) for e in errors)
        rules = body.get("rules")
        if isinstance(rules, list) and rules:
            seq = body.get("ledger_seq")
            recorded = f"; refusal recorded at ledger seq {seq}" if isinstance(seq, int) and seq >= 0 else ""
            detail += f" (rule {', '.join(map(str, rules))}{recorded})"
        if r.status_code == 401 and not self.has_token:
            detail += " (no token given: set JOBGATE_TOKEN or pass --token)"
        if r.status_code == 429:
            detail += f"; {_when_to_retry(r.headers.get('retry-after'))}"
        return detail


def _when_to_retry(retry_after: str | None) -> str:
    """A 429's Retry-After (delay-seconds or an HTTP-date, RFC 9110 §10.2.3) in words, with the clock time."""
    now = datetime.now(UTC)
    at: datetime | None = None
    if retry_after and retry_after.strip().isdigit():
        at = now + timedelta(seconds=int(retry_after))
    elif retry_after:
        try:
            at = parsedate_to_datetime(retry_after)
        except (TypeError, ValueError):
            at = None
    if at is None or at.tzinfo is None:
        return "try again later"
    wait = max(0, math.ceil((at - now).total_seconds()))
    return f"try again in {wait} s (after {at.astimezone().strftime('%H:%M:%S')})"


def _as_option(error: object, options: Mapping[str, str]) -> str:
    """One field error of a 422 in the command's words: `labels.team` becomes `--label team`."""
    if not isinstance(error, dict):
        return str(error)
    field, message = str(error.get("field", "")), str(error.get("message", ""))
    head, _, rest = field.partition(".")
    name = options.get(head, field or "body")
    return f"{name}{' ' + rest if rest and head in options else ''}: {message}"


CONNECTION = ("gateway", "token", "trigger")  # the options that say where a command calls and as whom
_ENV = {"gateway": "JOBGATE_URL", "token": "JOBGATE_TOKEN", "trigger": "JOBGATE_TRIGGER"}
_HELP = {
    "gateway": "Gateway URL (or JOBGATE_URL).",
    "token": "Bearer token (or JOBGATE_TOKEN).",
    # One meaning everywhere: the pipeline run behind a service account's call (F1), sent as X-Jobgate-Trigger.
    # (An emergency stop's safety or security concern is its --concern.)
    "trigger": "Service accounts: the pipeline run that calls, e.g. ci/nightly#42 (or JOBGATE_TRIGGER).",
}


_METAVAR = {"gateway": "URL", "token": "TOKEN", "trigger": "RUN"}


def effective_url() -> str:
    """The URL a command calls when no --gateway is given: JOBGATE_URL's (click, too, ignores an empty one)."""
    return os.environ.get("JOBGATE_URL") or DEFAULT_URL


class ClientOption(click.Option):
    """`--gateway`, `--token` or `--trigger`. The help of `--gateway` names the URL a call goes to now
    (JOBGATE_URL's when it is set), not the built-in default."""

    def get_help_extra(self, ctx: click.Context) -> Any:
        extra = super().get_help_extra(ctx)
        if self.name == "gateway":
            extra["default"] = f"{effective_url()} (JOBGATE_URL)" if os.environ.get("JOBGATE_URL") else DEFAULT_URL
        return extra


def _settings(name: str, *, after: bool = False) -> dict[str, Any]:
    """How option NAME is declared. After the subcommand it has neither environment variable nor default, so
    that only a value written there stands in for the group's."""
    return {"envvar": None if after else _ENV[name],
            "default": DEFAULT_URL if name == "gateway" and not after else None, "show_default": name == "gateway",
            "help": _HELP[name], "metavar": _METAVAR[name]}


def client_options(f: Any) -> Any:
    """--gateway/--token/--trigger (or JOBGATE_URL/JOBGATE_TOKEN/JOBGATE_TRIGGER) on a command of its own (not in
    a group), passed to it as `gateway`, `token` and `trigger`. Groups are ClientGroups instead."""
    for name in reversed(CONNECTION):
        f = click.option(f"--{name}", cls=ClientOption, **_settings(name))(f)
    return f


def _given_before(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A group's --gateway/--token/--trigger (or its environment variable, or the default) into its Client."""
    base = ctx.obj if isinstance(ctx.obj, Client) else Client(DEFAULT_URL, None, None,
                                                              getattr(ctx.command, "timeout", 30.0))
    ctx.obj = base.but(**{str(param.name): value})
    return value


def _given_after(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --gateway/--token/--trigger written after the subcommand: it stands in for the group's, for this command."""
    if value is not None:
        client = ctx.find_object(Client)
        assert client is not None, "a ClientGroup's command runs under the group's Client"
        ctx.obj = client.but(**{str(param.name): value})
    return value


class ClientGroup(click.Group):
    """A group of commands that call the gateway. `--gateway`, `--token` and `--trigger` go before the subcommand
    (`jobgate job --token T list`) or after it (`jobgate job list --token T`), the one after winning; the group
    keeps them in a Client in ctx.obj, which its commands take with @click.pass_obj.

    `offline` names the group's commands that never call the gateway (they take none of the three), `timeout`
    the seconds a call may take."""

    def __init__(self, *args: Any, offline: Iterable[str] = (), timeout: float = 30.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offline = frozenset(offline)
        self.timeout = timeout
        self.params.extend(ClientOption([f"--{name}"], callback=_given_before, expose_value=False, **_settings(name))
                           for name in CONNECTION)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Raises TypeError for a command that has an option of the three's names of its own."""
        if (name or cmd.name) not in self.offline:
            if clash := [p.name for p in cmd.params if p.name in CONNECTION]:
                raise TypeError(f"{cmd.name} has its own {clash}: a command of a ClientGroup takes the group's")
            cmd.params.extend(ClientOption([f"--{name}"], callback=_given_after, expose_value=False,
                                           **_settings(name, after=True)) for name in CONNECTION)
        super().add_command(cmd, name)


def emit_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Plain aligned text table: columns are (key, heading)."""
    if not rows:
        return "(none)"
    cells = [[str(r.get(k, "") if r.get(k) is not None else "-") for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (_, h) in enumerate(columns)]
    head = "  ".join(h.upper().ljust(w) for (_, h), w in zip(columns, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join([head.rstrip(), *body])


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
