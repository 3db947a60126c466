"""Errors of the scheduler core: one root, fields rather than prose (house style)."""

from __future__ import annotations

from dataclasses import dataclass


class SchedulerError(Exception):
    """Root of every error the scheduler core raises."""

    def diagnostics(self) -> str:
        return str(self)


@dataclass
class InvalidConfig(SchedulerError):
    """A SchedulerConfig value that cannot be scheduled with."""

    field: str
    problem: str

    def __str__(self) -> str:
        return f"invalid scheduler config {self.field}: {self.problem}"


@dataclass
class InvalidRecord(SchedulerError):
    """One node or job record whose own fields contradict each other (bad shape, unknown queue ...)."""

    kind: str
    id: str
    problem: str

    def __str__(self) -> str:
        return f"invalid {self.kind} {self.id!r}: {self.problem}"


@dataclass
class InconsistentSnapshot(SchedulerError):
    """Records that contradict each other: duplicate ids, running GPUs listed as free, naive times."""

    problem: str

    def __str__(self) -> str:
        return f"inconsistent snapshot: {self.problem}"
