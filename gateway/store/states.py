"""Job states, grouped the way services ask about them."""

from __future__ import annotations

PENDING_STATES = ("pending",)
ACTIVE_STATES = ("starting", "running", "stop_requested", "stopping")
# GPUs withheld with no known end (gateway/jobs/stops.py): counted as held against quotas and in usage, never
# planned around.
WITHHELD_STATES = ("lost", "stop_failed")
ENDED_STATES = ("stopped", "stop_failed", "succeeded", "failed")
# Ended, or ended and then deleted (A6): nothing about its scheduling can change any more.
PAST_STATES = (*ENDED_STATES, "deleted")
# A stop starts from these; a job already stopping keeps the stop in progress (gateway/jobs.execute_stop).
STOPPABLE_STATES = ("pending", "starting", "running", "lost")
STOPPING_STATES = ("stop_requested", "stopping")
# Every state a job row can hold, in life-cycle order: the groups above, and a paused job (stopped with its
# checkpoint kept, to be resumed; gateway/jobs/lifecycle.py) and a deleted one. `jobgate job list --state` offers these.
JOB_STATES = ("pending", "starting", "running", "stop_requested", "stopping", "paused", "stopped", "stop_failed",
              "succeeded", "failed", "lost", "deleted")
