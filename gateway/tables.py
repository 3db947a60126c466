"""Imports every module that declares business-DB tables, so `create_all` sees them all.

Add one import line here when you add a module with tables (they all share `gateway.models.Base`).
"""

from __future__ import annotations

import gateway.approval_facts
import gateway.approvals
import gateway.breakglass
import gateway.models
import gateway.notifications
import gateway.reconcile
import gateway.scheduler_tables
import gateway.stop_tables
from gateway.models import Base

__all__ = ["Base", "gateway"]
