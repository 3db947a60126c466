"""Reads through slurmrestd (OpenAPI v0.0.38), authenticated with a JWT the client signs itself.

Only reads: v0.0.38 has no requeue and cannot signal only the batch script, so mutations stay with the
commands (client.py). The documents are the ones `squeue --json` and `sacct --json` print, parsed by
the same code. Errors map as the commands' do: no connection is RestDown, no answer in time
SlurmTimeout, 401/403 PermissionDenied, and an `errors` entry in the body is classified by its text
(a refused token is "Protocol authentication error" from the accounting API, but only "Unspecified
error" from the /slurm/ API, as when slurmctld is down: the reader then asks the accounting API which).
"""

from __future__ import annotations

import os
import pwd
import time
from typing import Any

import httpx

from gateway.execution.slurm.commands import classify
from gateway.execution.slurm.connection import SlurmConnection
from gateway.execution.slurm.errors import (
    ControllerDown,
    PermissionDenied,
    RestDown,
    SlurmCommandFailed,
    SlurmConfigError,
    SlurmTimeout,
)
from gateway.execution.slurm.jwt_token import mint_token, read_key
from gateway.execution.slurm.parse import (
    DocumentError,
    document_errors,
    load_document,
    parse_accounted_jobs,
    parse_queued_jobs,
)
from gateway.execution.slurm.records import AccountedJob, QueuedJob

API = "/slurm/v0.0.38"
DB_API = "/slurmdb/v0.0.38"
_NOTHING_FOUND = 9003


class SlurmRestReader:
    """GETs to slurmrestd as one Slurm user (the connection's, else this process's own).

    Raises SlurmConfigError at construction when the connection has no rest_url or jwt_key, or the key
    cannot be read. A token is minted per `token_lifetime_s` and reused until 30 s before it expires."""

    def __init__(self, conn: SlurmConnection, *, token_lifetime_s: int = 600,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not conn.rest_url or conn.jwt_key is None:
            raise SlurmConfigError("slurmrestd", "the connection names no rest_url and jwt_key")
        self.user = conn.user or pwd.getpwuid(os.geteuid()).pw_name
        self._key = read_key(conn.jwt_key)
        self._lifetime = token_lifetime_s
        self._token: tuple[str, float] | None = None
        self._http = httpx.Client(base_url=conn.rest_url, timeout=conn.timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SlurmRestReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        now = time.time()
        if self._token is None or self._token[1] - 30 < now:
            token = mint_token(self._key, self.user, now=int(now), lifetime_s=self._lifetime)
            self._token = (token, now + self._lifetime)
        return {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token[0]}

    def _get(self, path: str) -> tuple[str, str]:
        command = f"GET {path}"
        try:
            r = self._http.get(path, headers=self._headers())
        except httpx.TimeoutException as e:
            raise SlurmTimeout(command, "", self.user, timeout_s=float(self._http.timeout.read or 0)) from e
        except httpx.TransportError as e:
            raise RestDown(command, f"{type(e).__name__}: {e}", self.user) from e
        if r.status_code in (401, 403):
            raise PermissionDenied(command, f"HTTP {r.status_code} {r.text.strip()[:200]}", self.user)
        if r.status_code >= 300 and not r.text.lstrip().startswith("{"):
            raise SlurmCommandFailed(command, f"HTTP {r.status_code} {r.text.strip()[:200]}", self.user)
        return command, r.text

    def _raise_for(self, command: str, errors: list[DocumentError], *, probe: bool = False) -> None:
        errors = [e for e in errors if e.number != _NOTHING_FOUND]
        if not errors:
            return
        text = "\n".join(e.line() for e in errors)
        if probe and "unspecified error" in text.lower():
            # slurmrestd passes the token on; when slurmctld refuses it, or does not answer, a /slurm/ read
            # says only "Unspecified error". The accounting API names a refused token, so ask it which.
            self._probe_token(command)
            raise ControllerDown(command, f"{text} (the token is good, so slurmctld is not answering)", self.user)
        raise classify(command, self.user, text, 1)

    def _probe_token(self, command: str) -> None:
        probe, text = self._get(f"{DB_API}/user/{self.user}")
        doc = load_document(text, probe, self.user)
        refused = [e for e in document_errors(doc, probe, self.user) if "authentication" in e.line().lower()]
        if refused:
            raise PermissionDenied(command, f"slurmctld refused the token ({refused[0].line()})", self.user)

    def ping(self) -> dict[str, Any]:
        """slurmrestd's view of the controllers. Raises SlurmError."""
        command, text = self._get(f"{API}/ping")
        doc = load_document(text, command, self.user)
        self._raise_for(command, document_errors(doc, command, self.user), probe=True)
        return doc

    def jobs(self) -> list[QueuedJob]:
        """Every job slurmctld holds (as `squeue --json`). Raises SlurmError."""
        command, text = self._get(f"{API}/jobs")
        jobs, errors = parse_queued_jobs(text, command, self.user)
        self._raise_for(command, errors, probe=True)
        return jobs

    def accounting(self, job_id: int) -> list[AccountedJob]:
        """The accounting rows of one job, one per attempt (as `sacct --json -D -j ID`). Raises SlurmError."""
        command, text = self._get(f"{DB_API}/job/{int(job_id)}")
        rows, errors = parse_accounted_jobs(text, command, self.user)
        self._raise_for(command, errors)
        return rows
