"""A scripted node agent over the real HTTP API (its own node token), for stop state-machine tests."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gateway_testkit import Api, job_spec

from gateway.native.scheduler_loop import run_once


@dataclass
class FakeAgent:
    api: Api
    node: str
    instance: str = "inst-1"

    @property
    def token(self) -> str:
        return (self.api.settings.data_dir / "agents" / self.node / "state" / "token").read_text().strip()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def beat(self, running: list[str] | None = None, gpus: int = 8) -> None:
        body = {"gpus": gpus, "running": [{"job_id": j, "pid": 1, "gpus": []} for j in running or []],
                "version": "test", "instance": self.instance}
        r = self.api.client.post(f"/v1/agents/{self.node}/heartbeat", json=body, headers=self._headers())
        assert r.status_code == 200, r.text

    def take(self) -> list[dict[str, Any]]:
        r = self.api.client.get(f"/v1/agents/{self.node}/commands", params={"wait": 0}, headers=self._headers())
        assert r.status_code == 200, r.text
        return [{**json.loads(e["payload"]), "envelope": e} for e in r.json()["commands"]]

    def report(self, job_id: str, event: str, nonce: str | None, **extra: Any) -> None:
        body = {"reports": [{"job_id": job_id, "event": event, "nonce": nonce, "at": time.time(), **extra}]}
        r = self.api.client.post(f"/v1/agents/{self.node}/reports", json=body, headers=self._headers())
        assert r.status_code == 200, r.text


def stopped_evidence(*, gone: bool = True, outcome: str = "graceful", checkpoints: list[dict[str, Any]] | None = None
                     ) -> dict[str, Any]:
    return {"signal": "SIGTERM", "signal_sent_at": time.time(), "grace_seconds": 30, "exited_at": time.time(),
            "exit_code": 0 if outcome == "graceful" else None,
            "exit_signal": None if outcome == "graceful" else "SIGKILL", "outcome": outcome,
            "process_group_gone": gone, "gpus_released": [0, 1] if gone else [],
            "checkpoints": checkpoints or [], "artifacts": checkpoints or [], "log_tail": []}


CKPT = [{"path": "checkpoints/step-9.ckpt", "size": 7, "mtime": 1.0, "sha256": "ab" * 32}]


def finish_stop(agent: FakeAgent, job_id: str) -> None:
    """The agent takes the job's stop command and reports it stopped gracefully, with checkpoint CKPT."""
    (stop,) = [c for c in agent.take() if c["kind"] == "stop" and c["job_id"] == job_id]
    agent.report(job_id, "stopping", stop["nonce"])
    agent.report(job_id, "stopped", stop["nonce"], evidence=stopped_evidence(checkpoints=CKPT))


def shift_clock(api: Api, seconds: float) -> None:
    """Move the gateway's clock forward (never backward) by `seconds`."""
    gw = api.gateway
    before = gw.clock
    gw.clock = lambda: before() + timedelta(seconds=seconds)


def running_job(api: Api, agent: FakeAgent, who: str = "alice", **spec: Any) -> tuple[str, str]:
    """Submit, place and report started; returns (job id, start nonce)."""
    r = api.post("/v1/jobs", who, json=job_spec(**spec))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    run_once(api.gateway)
    starts = [c for c in agent.take() if c["kind"] == "start" and c["job_id"] == job_id]
    assert len(starts) == 1, starts
    agent.report(job_id, "started", starts[0]["nonce"], pid=4242)
    assert api.get(f"/v1/jobs/{job_id}", who).json()["state"] == "running"
    return job_id, starts[0]["nonce"]


def ledger(api: Api) -> list[dict[str, Any]]:
    led = api.gateway.ledger
    return [json.loads(e.raw) for e in led.entries(0, led.size())]


def transitions(api: Api, job_id: str) -> list[str]:
    return [e["body"]["state_after"] for e in ledger(api)
            if e["kind"] == "transition" and e["body"].get("job_id") == job_id]


def gpus_used(api: Api, node: str) -> int:
    nodes = api.get("/v1/nodes", "dave").json()["nodes"]
    return int(next(n["gpus_used"] for n in nodes if n["id"] == node))


def notices(api: Api, who: str) -> list[dict[str, Any]]:
    return list(api.get("/v1/notifications", who).json()["notifications"])


def iso(dt: datetime) -> str:
    return dt.isoformat()
