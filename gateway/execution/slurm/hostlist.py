"""Slurm's host lists ("n[001-003,007],gpu1") as node names, without a call to `scontrol show hostnames`
(the poll loop reads every running job's list each cycle)."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p for p in (s.strip() for s in out) if p]


def expand(hostlist: str) -> list[str]:
    """The node names of a Slurm host list, in its order. Raises ValueError on a list it cannot read."""
    names: list[str] = []
    for item in _split_top(hostlist or ""):
        if "[" not in item:
            names.append(item)
            continue
        prefix, _, rest = item.partition("[")
        body, _, suffix = rest.partition("]")
        if "[" in suffix:
            raise ValueError(f"host list {hostlist!r}: one bracket group per name is all Slurm prints here")
        for piece in body.split(","):
            m = _RANGE.match(piece.strip())
            if not m:
                raise ValueError(f"host list {hostlist!r}: {piece!r} is not a number or a range")
            lo, hi = m.group(1), m.group(2) or m.group(1)
            width = len(lo)
            names.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return names
