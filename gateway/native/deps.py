"""What jobgate's own execution uses of the running gateway (app.py composes it; gateway/jobs/deps.py)."""

from __future__ import annotations

import threading
from typing import Protocol

import nacl.signing

from gateway.jobs.deps import Jobs
from gateway.native.bus import CommandBus


class Native(Jobs, Protocol):
    """What the job services use, plus: the key node commands are signed with (H1), the bus that wakes agents'
    long polls, and the event that wakes the scheduler loop."""

    command_key: nacl.signing.SigningKey
    bus: CommandBus
    scheduler_kick: threading.Event
