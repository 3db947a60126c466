"""What the access services use of the running gateway (app.py composes it; gateway/decisions/deps.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from sqlalchemy.orm import Session

from gateway.decisions.deps import Decider
from gateway.identity.token_cache import TokenCache
from gateway.settings import Settings
from gateway.store.signals import Signals


class Access(Decider, Protocol):
    """Deciding and recording, plus: the settings (grant and token bounds), the token cache a revocation clears,
    the signals that tell the other replicas' caches, and the policy lock held while role bindings change in the
    engine and the database together."""

    settings: Settings
    token_cache: TokenCache
    signals: Signals
    policy_lock: threading.RLock

    def after_commit(self, session: Session, action: Callable[[], None]) -> None: ...
