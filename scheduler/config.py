"""SchedulerConfig from plain data (a parsed YAML or JSON file), for the gateway and the simulator.

Keys are SchedulerConfig's field names; per-queue mappings may name only some queues (the rest keep
their defaults). Unknown keys are refused, so a typo never silently leaves a default in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from scheduler.errors import InvalidConfig
from scheduler.model import DEFAULT_CONFIG, SchedulerConfig

_PER_QUEUE = ("queue_baseline", "aging_per_hour", "aging_cap", "min_runtime_s")


def config_from_mapping(data: Mapping[str, Any] | None) -> SchedulerConfig:
    """Raises InvalidConfig for an unknown key, a value of the wrong type, or a value SchedulerConfig refuses."""
    if data is None:
        return DEFAULT_CONFIG
    if not isinstance(data, Mapping):
        raise InvalidConfig("config", "must be a mapping of setting names to values")
    known = {f.name for f in fields(SchedulerConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InvalidConfig(unknown[0], f"unknown setting; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _PER_QUEUE:
            if not isinstance(value, Mapping):
                raise InvalidConfig(key, "must map queue names to numbers")
            merged = dict(getattr(DEFAULT_CONFIG, key))
            for q, v in value.items():
                merged[str(q)] = _number(f"{key}.{q}", v)
            values[key] = merged
        elif key == "preempting_queues":
            if not isinstance(value, list | tuple) or not all(isinstance(q, str) for q in value):
                raise InvalidConfig(key, "must be a list of queue names")
            values[key] = tuple(value)
        elif key in ("backfill_depth", "max_preemption_attempts"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise InvalidConfig(key, "must be an integer")
            values[key] = value
        elif value is None and key == "max_occupancy_s":
            values[key] = None
        else:
            values[key] = _number(key, value)
    try:
        return SchedulerConfig(**values)
    except TypeError as e:  # pragma: no cover - every field is handled above
        raise InvalidConfig("config", str(e)) from e


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfig(name, f"must be a number, got {value!r}")
    return float(value)
