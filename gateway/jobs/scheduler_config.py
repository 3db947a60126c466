"""The scheduler's numbers (queue baselines, aging, fair share, occupancy, compensation): what the scheduler core
places with and what the job services apply on submission, requeue and renewal (Q3, P2, P3, Q8)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from gateway.jobs.deps import Jobs
from scheduler.config import config_from_mapping
from scheduler.errors import InvalidConfig
from scheduler.model import DEFAULT_CONFIG, SchedulerConfig


def scheduler_config(gw: Jobs) -> SchedulerConfig:
    """The scheduler's numbers: `gw.scheduler_config` if set, else the YAML file named by
    JOBGATE_SCHEDULER_CONFIG (read once), else the defaults. Raises InvalidConfig for a bad file."""
    if gw.scheduler_config is not None:
        return gw.scheduler_config
    path = os.environ.get("JOBGATE_SCHEDULER_CONFIG")
    config = DEFAULT_CONFIG
    if path:
        try:
            data = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise InvalidConfig("JOBGATE_SCHEDULER_CONFIG", f"cannot read {path}: {e}") from e
        config = config_from_mapping(data)
    gw.scheduler_config = config
    return config
