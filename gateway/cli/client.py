"""HTTP client used by the CLI: one place that turns transport and problem+json errors into one line."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, NoReturn
from urllib.parse import quote

import click
import httpx

DEFAULT_URL = "http://127.0.0.1:8080"


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
    """Raises ApiError (one line, exit 1) for a token or trigger that cannot be sent, and from `request`."""

    def __init__(self, url: str, token: str | None, trigger: str | None = None, timeout: float = 30.0) -> None:
        headers = {"User-Agent": "jobgate-cli"}
        if token:
            headers["Authorization"] = "Bearer " + _header_value(token, "the token (--token or JOBGATE_TOKEN)")
        if trigger:
            headers["X-Jobgate-Trigger"] = _header_value(trigger, "the trigger (--trigger or JOBGATE_TRIGGER)")
        self.has_token = bool(token)
        self.url = url.rstrip("/")
        try:
            parsed = httpx.URL(self.url)
        except httpx.InvalidURL as e:  # e.g. an unclosed [ of an IPv6 address
            fail(f"{url!r} is not a gateway URL (--gateway or JOBGATE_URL): {e}")
        if parsed.scheme not in ("http", "https") or not parsed.host:
            fail(f"{url!r} is not a gateway URL (--gateway or JOBGATE_URL): write it like http://HOST:PORT")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        ctx = click.get_current_context(silent=True)
        if ctx is not None:  # close the kept-alive connection when the command ends, not at interpreter exit
            ctx.call_on_close(self.http.close)

    def request(self, method: str, *segments: str | int, options: Mapping[str, str] | None = None,
                **kwargs: Any) -> Any:
        """METHOD on the route `/v1/SEGMENTS` (see api_path: the path is only ever built from quoted segments, so
        no command can put an id into it raw); the JSON answer, or the text of any other. `options` names the
        command's option for each body field, so that a 422 speaks of `--runtime-limit`, not of the API's
        `runtime_limit_seconds`."""
        try:
            built = self.http.build_request(method, api_path(*segments), **kwargs)
        except httpx.InvalidURL as e:  # api_path quotes every id; kept so that nothing else can end in a traceback
            fail(f"cannot send this request: an id or name in it holds a character no URL can carry ({e})")
        except ValueError as e:  # JSON has no NaN or infinity
            fail(f"cannot send this request: a value in it cannot be written as JSON ({e})")
        try:
            r = self.http.send(built)
        except httpx.LocalProtocolError as e:  # its text may quote a header: the token
            fail(f"cannot send this request to {self.url} ({e.__class__.__name__}); check --token and --trigger")
        except httpx.HTTPError as e:
            fail(f"cannot reach the gateway at {self.url} ({e.__class__.__name__}: {e})")
        if r.status_code >= 400:
            fail(f"{r.status_code} {self._problem(r, options or {})}")
        if r.headers.get("content-type", "").startswith("application/json"):
            return r.json()
        return r.text


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


def client_options(f: Any) -> Any:
    """--gateway/--token (or JOBGATE_URL/JOBGATE_TOKEN) on every client command group."""
    f = click.option("--trigger", envvar="JOBGATE_TRIGGER", help="Service accounts: pipeline and run id.")(f)
    f = click.option("--token", envvar="JOBGATE_TOKEN", help="Bearer token (or JOBGATE_TOKEN).")(f)
    f = click.option("--gateway", envvar="JOBGATE_URL", default=DEFAULT_URL, show_default=True,
                     help="Gateway URL (or JOBGATE_URL).")(f)
    return f


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
