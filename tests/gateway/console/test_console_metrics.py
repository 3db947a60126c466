"""/metrics gauges read from the stores at scrape time, and request ids in responses, logs and the ledger."""

from __future__ import annotations

import io
import json
import logging

from console_testkit import Console, submit
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from gateway.logging_setup import JsonFormatter
from gateway.store.models import Job


def scrape(con: Console) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = con.browser().get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_state_gauges_follow_the_database(console: Console) -> None:
    before = scrape(console)
    assert before[("jobgate_queue_length", (("queue", "normal"),))] == 0
    assert ("jobgate_approvals_pending", (("action", "job.stop"),)) not in before
    running = submit(console, gpus_per_node=4)
    waiting = submit(console)
    stopped = submit(console)
    approval = console.api("POST", f"/v1/jobs/{waiting}/stop", "carol", json={"reason": "queue hog"}).json()
    assert approval["approval_id"]
    assert console.api("POST", f"/v1/jobs/{stopped}/stop", "alice", json={"reason": "not needed"}).status_code == 202
    gw = console.gateway
    # Stand in for the scheduler and an agent: one job runs on borrowed quota, one stop ended forced.
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == running).values(state="running", started_at=gw.clock()))
    after = scrape(console)
    assert after[("jobgate_approvals_pending", (("action", "job.stop"),))] == 1
    assert after[("jobgate_queue_length", (("queue", "normal"),))] == 1
    assert after[("jobgate_gpus_in_use", (("quota", "owned"), ("tenant", "vision")))] == 4
    assert after[("jobgate_stop_outcomes_total", (("outcome", "cancelled"),))] == 1
    assert after[("jobgate_stop_outcomes_total", (("outcome", "failed"),))] == 0
    assert after[("jobgate_queue_wait_seconds_count", (("queue", "normal"),))] == 1
    assert after[("jobgate_decisions_total", (("action", "job.stop"), ("effect", "needs_approval")))] >= 1
    assert after[("jobgate_ledger_entries", ())] == gw.ledger.size()
    assert after[("jobgate_ledger_batch_size_count", ())] >= 1
    with gw.transaction() as session:
        session.execute(update(Job).where(Job.id == running).values(state="stop_failed"))
    assert scrape(console)[("jobgate_stop_outcomes_total", (("outcome", "failed"),))] == 1


def test_request_id_on_response_in_log_line_and_in_ledger(console: Console) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logging.getLogger("jobgate.http").addHandler(handler)
    try:
        r = console.api("POST", "/v1/jobs", "alice", headers={"X-Request-Id": "trace-42"},
                        json={"name": "t", "project": "vision", "gpus_per_node": 1, "nodes": 1, "command": ["true"]})
        made = console.browser().get("/healthz")
        odd = console.browser().get("/healthz", headers={"X-Request-Id": "bad id\twith spaces"})
    finally:
        logging.getLogger("jobgate.http").removeHandler(handler)
    assert r.status_code == 201 and r.headers["x-request-id"] == "trace-42"
    assert made.headers["x-request-id"].startswith("req-")
    assert odd.headers["x-request-id"].startswith("req-")  # an unsafe id is replaced, not logged
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    (line,) = [x for x in lines if x.get("request_id") == "trace-42"]
    assert line["path"] == "/v1/jobs" and line["status"] == 201 and line["method"] == "POST"
    assert line["logger"] == "jobgate.http" and "duration_ms" in line
    entry = console.api("GET", "/v1/audit/entries", "audrey", params={"action": "job.submit"}).json()["entries"][0]
    body = console.gateway.ledger.entry(entry["seq"]).value["body"]
    assert body["source"]["request_id"] == "trace-42"
