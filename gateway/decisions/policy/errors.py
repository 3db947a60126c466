"""Errors of the policy package: one root, problems carried as fields."""

from __future__ import annotations

from dataclasses import dataclass


class PolicyError(Exception):
    """Root of every error raised by gateway.decisions.policy."""

    def diagnostics(self) -> str:
        return str(self)


@dataclass(frozen=True)
class PolicyProblem:
    """One defect in a policy file; `line` is 1-based, 0 when the defect has no single line."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class PolicyLoadError(PolicyError):
    """A policy set was refused at load; the last good set stays active (DESIGN "Policies")."""

    def __init__(self, errors: list[PolicyProblem]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(str(p) for p in self.errors))

    def diagnostics(self) -> str:
        return "policy set refused:\n" + "\n".join(f"  {p}" for p in self.errors)
