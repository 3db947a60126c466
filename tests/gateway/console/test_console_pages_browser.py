"""The console's pages as Chromium lays them out: the admin's charts (Q11, Q10) drawn on the server and shown with
nothing fetched from elsewhere, and ids kept whole on a narrow screen.

Screenshots go to the test's tmp dir, for a person to look at; nothing asserts on them.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from console_browser_kit import browser
from console_testkit import Console, ran, submit
from sqlalchemy import update

from gateway.store.models import Node
from gateway.store.scheduler_tables import QuotaRow

pytestmark = [pytest.mark.integration, pytest.mark.parametrize("console", ["sqlite"], indirect=True)]


def luminance(rgb: str) -> float:
    r, g, b = (int(v) for v in rgb[4:-1].split(","))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def sign_in(page: Any, url: str, token: str) -> None:
    page.goto(url + "/ui/login")
    page.fill("input[name=token]", token)
    page.click("button[type=submit]")
    page.wait_for_selector("#me")


def busy_cluster(con: Console) -> dict[str, str]:
    """vision past its 4-GPU quota for two days, speech (no quota) on 8 of the 16 GPUs since this morning, jobs
    that waited from seconds to hours, and one waiting now."""
    gw = con.gateway
    now = gw.clock()
    jobs = {"long": submit(con, gpus_per_node=6), "short": submit(con, gpus_per_node=1),
            "speech": submit(con, "mallory", project="speech", gpus_per_node=8),
            "waiting": submit(con, gpus_per_node=8, nodes=2)}
    with gw.transaction() as session:  # the quota after the jobs: admission would refuse a job that cannot fit it
        session.execute(update(Node).values(state="alive"))
        session.add(QuotaRow(project="vision", gpus=4, borrow_limit=None, lend_limit=None, users={}, updated_at=now,
                             updated_by="erin"))
    ran(con, jobs["long"], started_ago=timedelta(days=1, hours=20), waited=timedelta(seconds=20),
        node="demo-node-1", gpus=[0, 1, 2, 3, 4, 5])
    ran(con, jobs["short"], started_ago=timedelta(minutes=40), waited=timedelta(hours=3), node="demo-node-1",
        gpus=[6])
    ran(con, jobs["speech"], started_ago=timedelta(hours=min(now.hour, 6), minutes=now.minute // 2),
        waited=timedelta(minutes=7), node="demo-node-2", gpus=list(range(8)))
    return jobs


def test_admin_charts_are_drawn_on_the_server_and_read_in_the_browser(console: Console, served: str,
                                                                      tmp_path: Path) -> None:
    busy_cluster(console)
    asked: list[str] = []
    with browser() as b:
        page = b.new_page(viewport={"width": 1280, "height": 1000})  # type: ignore[attr-defined]
        page.on("request", lambda r: asked.append(r.url))
        sign_in(page, served, console.tokens["erin"])
        page.goto(served + "/ui/admin")
        page.screenshot(path=str(tmp_path / "erin-admin.png"), full_page=True)

        heat = page.locator("#heatmap svg.chart-heatmap")
        assert heat.bounding_box()["width"] > 400  # drawn, at a size to read
        cells = page.locator("#heatmap g.cell")
        assert cells.count() == 2 * 7  # vision and speech × the last seven days
        shown = {c["title"].split(":")[0]: c for c in cells.evaluate_all(
            "(gs) => gs.map(g => ({title: g.querySelector('title').textContent,"
            " text: g.querySelector('text').textContent, fill: getComputedStyle(g.querySelector('rect')).fill}))")}
        today, week_ago = (console.gateway.clock() - timedelta(days=d) for d in (0, 6))
        vision = shown[f"vision on {today.date().isoformat()}"]  # past its quota
        speech = shown[f"speech on {today.date().isoformat()}"]  # half the cluster, part of the day
        idle = shown[f"speech on {week_ago.date().isoformat()}"]  # nothing ran
        r, g, bl = (int(v) for v in vision["fill"][4:-1].split(","))
        assert r > g > bl, vision  # orange: past the quota, on borrowed GPUs
        assert vision["text"].endswith("%") and int(vision["text"][:-1]) > 100, vision
        assert luminance(speech["fill"]) < luminance(idle["fill"]), (speech, idle)  # busier is darker

        bars = page.locator("#waits svg.chart-bars g.bar")
        assert bars.count() == 3 * 6  # urgent, normal, batch × six buckets
        counts = [int(x) for x in bars.evaluate_all("(gs) => gs.map(g => g.dataset.count)")]
        assert sum(counts) == 3 and "3 started: median 7 min, p90 3 h" in page.locator("#waits").inner_text()
        height = page.locator("#waits svg").evaluate("(s) => s.getBoundingClientRect().height")
        assert height > 120  # a full-width card: the text stays readable

        bands = page.locator("#usage-over-time polygon.band")
        assert bands.evaluate_all("(ps) => ps.map(p => p.dataset.label)") == ["speech", "vision"]
        assert page.locator("#usage-over-time line.capacity").count() == 1
        assert "all 16 GPUs" in page.locator("#usage-over-time").inner_text()

        # Everything came from the gateway itself: no CDN, no chart library, no script at all.
        assert asked and all(u.startswith(served) for u in asked), asked
        assert page.locator("script").count() == 0

        # The researcher's page has the same chart of the cluster.
        page.click("text=Sign out")
        sign_in(page, served, console.tokens["alice"])
        assert page.locator("#usage-over-time polygon.band").count() == 2
        page.screenshot(path=str(tmp_path / "alice-home.png"), full_page=True)
    print("screenshots in", tmp_path)


ONE_LINE = "(els) => els.filter(e => e.getClientRects().length > 1).map(e => e.textContent)"


def test_ids_do_not_wrap_mid_id_on_a_narrow_screen(console: Console, served: str, tmp_path: Path) -> None:
    """A job id broke at its hyphen in a squeezed table column: "j-" on one line, the rest on the next."""
    jobs = busy_cluster(console)
    with browser() as b:
        page = b.new_page(viewport={"width": 420, "height": 900})  # type: ignore[attr-defined]
        sign_in(page, served, console.tokens["alice"])
        for path in ("/ui/", f"/ui/jobs/{jobs['waiting']}"):
            page.goto(served + path)
            ids = page.locator(".id, a[href^='/ui/jobs/']")
            assert ids.count() >= (4 if path == "/ui/" else 1), path
            assert ids.evaluate_all(ONE_LINE) == [], path
            page.screenshot(path=str(tmp_path / f"alice-narrow-{path.count('/')}.png"), full_page=True)
