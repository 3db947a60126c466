"""The console's routers: /ui pages and the JSON they share with the CLI (/v1/stats/*, /v1/audit/*)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.console import job_actions, ops_pages, pages, stats_api

ROUTERS: list[APIRouter] = [pages.router, job_actions.router, ops_pages.router, stats_api.router]
