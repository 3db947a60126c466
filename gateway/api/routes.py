"""Every router the gateway serves. One import and one list entry per area."""

from __future__ import annotations

from fastapi import APIRouter

from gateway import metrics
from gateway.api import agents, health, jobs, ledger, nodes
from gateway.api import approvals as approvals_api
from gateway.api import batch as batch_api
from gateway.api import breakglass as breakglass_api
from gateway.api import emergency as emergency_api
from gateway.api import forensics as forensics_api
from gateway.api import identity as identity_api
from gateway.api import inventory as inventory_api
from gateway.api import lifecycle as lifecycle_api
from gateway.api import notifications as notifications_api
from gateway.api import policy as policy_api
from gateway.api import priority as priority_api
from gateway.api import queue as queue_api
from gateway.api import quotas as quotas_api
from gateway.api import roles as roles_api

ROUTERS: list[APIRouter] = [
    health.router,
    metrics.router,
    jobs.router,
    nodes.router,
    ledger.router,
    agents.router,
    approvals_api.router,
    batch_api.router,
    breakglass_api.router,
    emergency_api.router,
    forensics_api.router,
    identity_api.router,
    inventory_api.router,
    lifecycle_api.router,
    notifications_api.router,
    queue_api.router,
    quotas_api.router,
    policy_api.router,
    priority_api.router,
    roles_api.router,
]
