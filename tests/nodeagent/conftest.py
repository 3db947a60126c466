"""Fixtures for node-agent tests; the helpers behind them live in nodeagent_testkit.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import nacl.signing
import pytest
from nodeagent_testkit import AgentProcess, EventLog, FakeGateway

from nodeagent.runner import Runner


@pytest.fixture
def events() -> EventLog:
    return EventLog()


@pytest.fixture
def runner(tmp_path: Path, events: EventLog) -> Iterator[Runner]:
    r = Runner(tmp_path / "agent", events)
    yield r
    # Never leave a job behind: kill whatever a failing test left running.
    for record in r.running():
        r.stop(record.job_id, 0)
    r.join_stops(10)
    r.close()


@pytest.fixture
def signing_key() -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey.generate()


@pytest.fixture
def gateway(signing_key: nacl.signing.SigningKey) -> Iterator[FakeGateway]:
    g = FakeGateway(signing_key)
    yield g
    g.close()


@pytest.fixture
def agent_process(tmp_path: Path, gateway: FakeGateway, signing_key: nacl.signing.SigningKey) -> Iterator[AgentProcess]:
    agent = AgentProcess(tmp_path, gateway.url, signing_key)
    yield agent
    with contextlib.suppress(Exception):
        agent.stop()
    if agent.proc is not None:
        agent.proc.kill()
        agent.proc.wait()
    agent.kill_leftover_jobs()
