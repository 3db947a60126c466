"""Fixtures for console tests: the e2e demo system (browser tests) and an in-process app (fast tests)."""

from __future__ import annotations

import sys
from pathlib import Path

_E2E = str(Path(__file__).resolve().parents[2] / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402
from console_testkit import Console, console  # noqa: E402
from e2e_testkit import demo_system  # noqa: E402
from served_app import served as serve_app  # noqa: E402

__all__ = ["console", "demo_system", "served"]


@pytest.fixture
def served(console: Console) -> Iterator[str]:
    """The fixture's app behind a real uvicorn socket, for a real browser."""
    with serve_app(console.app) as url:
        yield url
