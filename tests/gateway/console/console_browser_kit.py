"""Playwright on Debian's Chromium (never `playwright install`): sign in and read pages like a person."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def chromium_path() -> str:
    """The system Chromium; CI installs it (.ci/run). Fails, not skips, when JOBGATE_REQUIRE_BROWSER=1."""
    for candidate in (os.environ.get("JOBGATE_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and Path(candidate).exists():
            return candidate
    if os.environ.get("JOBGATE_REQUIRE_BROWSER") == "1":
        pytest.fail("JOBGATE_REQUIRE_BROWSER=1 but no Chromium: apt-get install -y chromium")
    pytest.skip("no Chromium installed (apt-get install -y chromium)")


# Chromium resolves no host name but 127.0.0.1's: a page sees the machine as offline.
OFFLINE_ARGS = ["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"]


@contextmanager
def browser(*extra_args: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    path = chromium_path()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, headless=True, args=[*CHROMIUM_ARGS, *extra_args])
        try:
            yield b
        finally:
            b.close()
