"""The API docs (/docs, /redoc) in a real browser on a machine without internet: every operation renders, with
its example body, and the page asks nothing of any host but the gateway's. FastAPI's own pages load Swagger UI
from a CDN, and were blank offline. (Here beside the console's browser tests, for their browser kit.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from console_browser_kit import OFFLINE_ARGS, browser
from served_app import served

from gateway.app import create_app
from gateway.settings import Settings

pytestmark = [pytest.mark.integration]


@pytest.fixture
def docs_url(tmp_path: Path) -> Iterator[tuple[str, set[str]]]:
    """The gateway app behind a real socket (the docs need no stores: its lifespan does not run), and the
    operation ids of its OpenAPI document."""
    app = create_app(Settings(data_dir=tmp_path))
    ids = {op["operationId"] for ops in app.openapi()["paths"].values() for op in ops.values()}
    with served(app) as url:
        yield url, ids


def offline_page(b: Any, url: str) -> tuple[Any, list[str], list[str]]:
    """A page whose every request to another host is refused and written down, and the page's script errors."""
    page = b.new_page(viewport={"width": 1280, "height": 1000})
    outside: list[str] = []
    errors: list[str] = []

    def only_the_gateway(route: Any) -> None:
        if route.request.url.startswith(url + "/"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", only_the_gateway)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, outside, errors


# Each page's element for one operation, and the attribute that names it (its operationId at the end).
@pytest.mark.parametrize(("path", "operation", "named_by"), [
    ("/docs", ".opblock", "id"),  # operations-TAG-OPERATION_ID
    ("/redoc", "[data-section-id*='operation/']", "data-section-id"),  # [tag/TAG/]operation/OPERATION_ID
], ids=["swagger-ui", "redoc"])
def test_the_api_docs_render_every_operation_offline(docs_url: tuple[str, set[str]], tmp_path: Path, path: str,
                                                     operation: str, named_by: str) -> None:
    url, operation_ids = docs_url
    with browser(*OFFLINE_ARGS) as b:
        page, outside, errors = offline_page(b, url)
        page.goto(url + path)
        page.wait_for_selector(operation, timeout=30_000)
        page.wait_for_load_state("networkidle")
        names = page.locator(operation).evaluate_all(f"els => els.map(e => e.getAttribute('{named_by}'))")
        shown = {i for i in operation_ids if any(n.endswith(("-" if path == "/docs" else "/") + i) for n in names)}
        assert shown == operation_ids, f"not rendered: {sorted(operation_ids - shown)}"
        if path == "/docs":
            # An operation opened shows its example body, ready for "Try it out".
            page.locator("#operations-jobs-submit_job_v1_jobs_post .opblock-summary").click()
            body = page.locator("#operations-jobs-submit_job_v1_jobs_post .body-param__example")
            body.wait_for(timeout=10_000)
            assert "resnet50-lr0.1" in body.inner_text()
        page.screenshot(path=str(tmp_path / f"{path.strip('/')}.png"), full_page=False)
        assert not outside, f"{path} asked other hosts: {outside}"
        assert not errors, errors
