"""Who a job runs as (H1): never the agent's own uid when the agent can help it.

A job runs as its submitting person's Unix account where the site maps people to accounts, or else as a uid
allocated for that one run from a range the site reserves for jobs (what systemd's DynamicUser does for
services), with a group of the same number and no supplementary groups. A uid is handed out again only after
every process of the run that held it is gone and its files were given back to the agent, so one job can never
signal, trace or read another job, or the agent.
"""

from __future__ import annotations

import json
import os
import pwd
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.errors import ConfigError, InvalidCommand

# Outside every range systemd allocates from (DynamicUser 61184-65519, containers 524288-1879048191) and below
# 2^31, which some tools still read as a signed number.
DEFAULT_JOB_UIDS = range(2_000_000_000, 2_000_065_536)


@dataclass(frozen=True)
class JobIdentity:
    """The credentials one run of a job has: a person's account (`account` set) or an allocated uid."""

    uid: int
    gid: int
    account: str | None = None
    home: str | None = None

    @property
    def allocated(self) -> bool:
        return self.account is None


def parse_uid_range(text: str) -> range:
    """`"FIRST-LAST"` (inclusive) as a range; raises ConfigError for anything else or a range reaching uid 0."""
    first, sep, last = text.partition("-")
    try:
        lo, hi = int(first), int(last if sep else first)
    except ValueError as e:
        raise ConfigError(f"job uid range {text!r} is not FIRST-LAST") from e
    if not 0 < lo <= hi < 2**32 - 1:
        raise ConfigError(f"job uid range {text!r} must be 1 ≤ FIRST ≤ LAST < 4294967295")
    return range(lo, hi + 1)


def load_accounts(path: Path) -> dict[str, str]:
    """A JSON object mapping jobgate person ids to Unix account names; raises ConfigError if unusable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"account map {path}: {e}") from e
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        raise ConfigError(f"account map {path}: must be a JSON object of person id → Unix account name")
    return dict(data)


class Identities:
    """Hands out job identities. Not thread-safe on its own: the runner calls it under its lock."""

    def __init__(self, uids: range = DEFAULT_JOB_UIDS, accounts: Mapping[str, str] | None = None) -> None:
        self.uids = uids
        self._agent_uid = os.geteuid()
        self._accounts: dict[str, JobIdentity] = {}
        for person, name in (accounts or {}).items():
            self._accounts[person] = self._account(person, name)

    def _account(self, person: str, name: str) -> JobIdentity:
        try:
            entry = pwd.getpwnam(name)
        except KeyError as e:
            raise ConfigError(f"account map: {person} → {name!r}, but there is no such Unix account") from e
        if entry.pw_uid in (0, self._agent_uid) or entry.pw_uid in self.uids:
            raise ConfigError(f"account map: {person} → {name!r} (uid {entry.pw_uid}) is root, the agent's own uid "
                              "or inside the range of allocated job uids")
        return JobIdentity(entry.pw_uid, entry.pw_gid, name, entry.pw_dir)

    def assign(self, run_as: str | None, in_use: Collection[int]) -> JobIdentity:
        """The person's mapped account if there is one, else the lowest free uid of the range that no account
        on this host has. Raises InvalidCommand when the range is used up."""
        mapped = self._accounts.get(run_as) if run_as else None
        if mapped is not None:
            return mapped
        taken = set(in_use)
        for uid in self.uids:
            if uid in taken or _has_account(uid):
                continue
            return JobIdentity(uid, uid)
        raise InvalidCommand("exhausted", f"no free job uid left in {self.uids.start}-{self.uids.stop - 1}")


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
