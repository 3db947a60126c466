"""Fixtures for console tests: the e2e demo system (browser tests) and an in-process app (fast tests)."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent.parent
for sub in ("e2e",):
    if str(_TESTS / sub) not in sys.path:
        sys.path.insert(0, str(_TESTS / sub))

from e2e_testkit import demo_system  # noqa: E402

__all__ = ["demo_system"]
