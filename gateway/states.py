"""Job states, grouped the way services ask about them."""

from __future__ import annotations

PENDING_STATES = ("pending",)
ACTIVE_STATES = ("starting", "running", "stop_requested", "stopping")
ENDED_STATES = ("stopped", "stop_failed", "succeeded", "failed")
