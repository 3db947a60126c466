"""An in-process gateway with the demo cast, and a console client that signs in like a browser does."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings
from gateway.store.models import Allocation, Job
from gateway.store.scheduler_tables import SchedJob

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Console:
    app: Any
    tokens: dict[str, str]
    clients: list[TestClient] = field(default_factory=list)

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def browser(self) -> TestClient:
        """A fresh cookie jar on the same app (one person's browser)."""
        c = TestClient(self.app, base_url="http://testserver")
        self.clients.append(c)
        return c

    def sign_in(self, who: str) -> tuple[TestClient, str]:
        """Sign in through the form; returns the client and the session's CSRF token."""
        c = self.browser()
        nonce = csrf_of(c.get("/ui/login"))
        r = c.post("/ui/login", data={"token": self.tokens[who], "csrf": nonce}, follow_redirects=False)
        assert r.status_code == 303, r.text
        return c, csrf_of(c.get("/ui/"))

    def api(self, method: str, path: str, who: str, **kw: Any) -> httpx.Response:
        c = self.browser()
        return c.request(method, path, headers={"Authorization": f"Bearer {self.tokens[who]}",
                                                **kw.pop("headers", {})}, **kw)


def ran(con: Console, job_id: str, *, started_ago: timedelta, waited: timedelta, node: str | None = None,
        gpus: list[int] | None = None) -> None:
    """Stand in for the scheduler and a node: the job entered its queue `waited` before it started, `started_ago`
    (on `node`'s `gpus`, when given), and runs still."""
    gw = con.gateway
    now = gw.clock()
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == job_id).values(
            state="running", started_at=now - started_ago, submitted_at=now - started_ago - waited))
        session.execute(update(SchedJob).where(SchedJob.job_id == job_id).values(queued_at=now - started_ago - waited))
        if node:
            session.add(Allocation(job_id=job_id, node=node, gpus=gpus or [], state="running", released=False))


def csrf_of(r: httpx.Response) -> str:
    m = CSRF.search(r.text)
    assert m, f"no CSRF field in {r.url}: {r.status_code}"
    return m.group(1)


@pytest.fixture(params=["sqlite", "postgresql"])
def console(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Console]:
    if request.param == "sqlite":
        settings = Settings(data_dir=tmp_path)
    else:
        make = request.getfixturevalue("fresh_pg_database")
        settings = Settings(data_dir=tmp_path, database_url=make("jobgate_biz"), ledger_url=make("jobgate_ledger"))
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    app = create_app(settings, run_scheduler=False)
    with TestClient(app) as lifespan:
        con = Console(app, tokens, [lifespan])
        yield con
        for c in con.clients[1:]:
            c.close()


def submit(con: Console, who: str = "alice", **spec: Any) -> str:
    body = {"name": "train", "project": "vision", "gpus_per_node": 2, "nodes": 1, "command": ["sleep", "600"],
            **spec}
    r = con.api("POST", "/v1/jobs", who, json=body)
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


@dataclass
class PageForm:
    """A form as a browser would send it: its action, method and the fields it holds by default."""

    action: str
    method: str
    fields: dict[str, str]
    submits: list[tuple[str, str]]  # (name, value) of each named submit button; ("", "") for an unnamed one


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.forms: list[PageForm] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        elif tag == "form":
            self.forms.append(PageForm(a.get("action", ""), a.get("method", "get").lower(), {}, []))
        elif tag == "input" and self.forms and a.get("name") and a.get("type") not in ("submit", "checkbox", "radio"):
            self.forms[-1].fields[a["name"]] = a.get("value", "")
        elif tag == "textarea" and self.forms and a.get("name"):
            self.forms[-1].fields[a["name"]] = ""
        elif tag == "button" and self.forms and a.get("type", "submit") == "submit":
            self.forms[-1].submits.append((a.get("name", ""), a.get("value", "")))


def links_and_forms(html: str) -> tuple[list[str], list[PageForm]]:
    """Every link's href and every form of a page, in page order."""
    parser = _Links()
    parser.feed(html)
    return parser.links, parser.forms
