"""Fixtures for end-to-end tests."""

from e2e_testkit import demo_system

__all__ = ["demo_system"]
