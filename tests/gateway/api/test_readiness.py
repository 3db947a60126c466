"""/healthz says the process lives; /readyz says whether this replica can decide and record now, with the reason
when it cannot. A replica that loses its business database stops answering ready and refuses mutations (503,
nothing changed) until the database is back: the connection to PostgreSQL runs through a proxy the test cuts."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from fastapi.testclient import TestClient
from gateway_testkit import Api, job_spec

from gateway.app import create_app
from gateway.demo import prepare_demo
from gateway.settings import Settings

pytestmark = pytest.mark.integration


class CuttableProxy:
    """TCP between the gateway and PostgreSQL; cut() drops every connection and refuses new ones."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            if listener.fileno() < 0:
                client.close()
                return
            server = socket.create_connection(self.upstream)
            with self._lock:
                self._open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        assert self._listener is not None
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked on it (close alone does not)
        self._listener.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self._open.clear()


def test_readiness_names_what_fails_and_a_replica_without_its_database_refuses_mutations_changing_nothing(
    tmp_path: Path, fresh_pg_database: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    biz = fresh_pg_database("jobgate_biz")
    parts = urlsplit(biz)
    proxy = CuttableProxy((parts.hostname or "127.0.0.1", parts.port or 5432))
    via_proxy = urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{proxy.port}"))
    settings = Settings(data_dir=tmp_path / "d", database_url=via_proxy, ledger_url=fresh_pg_database("jobgate_led"),
                        auth_cache_s=0)
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        assert api.post("/v1/jobs", "alice", json=job_spec()).status_code == 201
        ready = client.get("/readyz", headers=api.headers("alice"))
        assert ready.status_code == 200 and ready.json()["status"] == "ready", ready.text
        me = ready.json()["replicas"]
        assert me["role"] == "leader" and me["leader"]["id"] == me["replica"] and me["leader"]["epoch"] == 1

        proxy.cut()
        assert client.get("/healthz").status_code == 200  # the process lives
        with caplog.at_level(logging.WARNING, logger="jobgate.health"):
            down = client.get("/readyz", headers=api.headers("alice"))
        assert down.status_code == 503 and down.headers["content-type"] == "application/problem+json"
        assert down.json()["type"].endswith("/not-ready") and set(down.json()["checks"]) >= {"database"}
        # The token cannot be checked without the database (this gateway caches none): the reason, which names the
        # database's address, is in the replica's log, not in an answer anyone may ask for.
        assert f":{proxy.port}" not in down.text and str(proxy.port) in caplog.text
        assert "database" in down.json()["detail"]
        refused = api.post("/v1/jobs", "alice", json=job_spec(name="while-down"))
        assert refused.status_code == 503, refused.text
        assert refused.json()["type"].endswith("/database-unavailable")
        assert refused.headers["content-type"] == "application/problem+json"

        proxy.restore()
        again = client.get("/readyz")
        assert again.status_code == 200, again.text
        names = [j["name"] for j in api.get("/v1/jobs", "alice").json()["jobs"]]
        assert "while-down" not in names and len(names) == 1  # nothing changed


def test_openapi_documents_liveness_and_readiness_with_its_problem() -> None:
    spec = create_app(Settings()).openapi()
    assert set(spec["paths"]["/readyz"]["get"]["responses"]) == {"200", "503"}
    problem = spec["paths"]["/readyz"]["get"]["responses"]["503"]["content"]["application/problem+json"]
    assert problem["schema"] == {"$ref": "#/components/schemas/Problem"}
    for path in ("/readyz", "/healthz"):  # a token is optional: without one, the answer names no reasons or replicas
        assert spec["paths"][path]["get"]["security"] == [{}, {"bearer": []}]
        assert "401" not in spec["paths"][path]["get"]["responses"]


def test_only_a_caller_with_a_valid_token_is_told_reasons_and_replicas(tmp_path: Path) -> None:
    """A probe without a token learns whether the replica is ready, which checks failed and its role; a replica's id
    (host, port, process) and a check's reason (a database error names its server) only with a valid token."""
    settings = Settings(data_dir=tmp_path / "d")
    prepare_demo(settings)
    tokens = json.loads((settings.data_dir / "demo-tokens.json").read_text())
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        api = Api(client, tokens, settings)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        for headers in ({}, {"Authorization": "Bearer jg_not-a-token"}):
            assert client.get("/readyz", headers=headers).json()["replicas"] == {"role": "leader"}
            assert "replica" not in client.get("/healthz", headers=headers).json()
        told = client.get("/readyz", headers=api.headers("alice")).json()["replicas"]
        assert told["replica"] == gw.leadership.replica_id and told["leader"]["id"] == told["replica"]
        assert client.get("/healthz", headers=api.headers("alice")).json()["replica"] == gw.leadership.replica_id

        gw.ledger.write_problem = lambda: "the ledger's disk at /srv/jobgate is full"
        anonymous = client.get("/readyz")
        assert anonymous.status_code == 503 and anonymous.json()["checks"] == {
            "ledger": "failed (a caller with a valid token is told why)"}
        assert "/srv/jobgate" not in anonymous.text
        told_why = client.get("/readyz", headers=api.headers("alice"))
        assert told_why.json()["checks"] == {"ledger": "the ledger's disk at /srv/jobgate is full"}
