"""Fixtures for console tests: the e2e demo system (browser tests) and an in-process app (fast tests)."""

from __future__ import annotations

import sys
from pathlib import Path

_E2E = str(Path(__file__).resolve().parent.parent / "e2e")
if _E2E not in sys.path:
    sys.path.insert(0, _E2E)

from console_testkit import console  # noqa: E402
from e2e_testkit import demo_system  # noqa: E402

__all__ = ["console", "demo_system"]
