"""Make tests/assets/recorded_decisions.jsonl.gz: decision inputs the embedded engine decided, taken from ledgers.

The OPA tests (test_policy_opa.py) replay these through both OPA engines and compare with the embedded engine.
Each line is one decision entry of a gateway ledger, as the embedded engine saw it: the recorded input with
`granted` and `actor.roles` put in from the role bindings of that gateway's business DB. Only entries decided by
the current policy set (same hash), by the policy (not a token scope or rate limit), without a break-glass
override, and that the embedded engine still decides as recorded (so the bindings read are the ones it used)
are kept, each distinct input once.

To remake it, run gateway API tests with their data dirs kept, then harvest them:

    .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp=/tmp/capture tests/gateway/jobs/test_jobs_api.py ...
    .venv/bin/python tests/gateway/decisions/policy/recorded_decisions.py tests/assets/recorded_decisions.jsonl.gz \
        /tmp/capture
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
NOT_BY_POLICY = {"token_scope", "H2.rate_limit", "fail_closed"}


def bindings_of(database: Path) -> list[Any]:
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from gateway.decisions.policy import RoleBinding
    from gateway.store.models import RoleBinding as Row

    engine = create_engine(f"sqlite:///{database}")
    try:
        with Session(engine) as session:
            return [RoleBinding(r.principal_id, r.role, r.project) for r in session.scalars(select(Row)).all()]
    finally:
        engine.dispose()


def harvest(roots: list[Path]) -> Iterator[dict[str, Any]]:
    """Every kept decision under `roots` (see the module doc), as {"seq", "ledger", "input", "effect"}."""
    from gateway.decisions.policy import EmbeddedEngine, load_policy_set
    from ledger.store import open_store

    policy_set = load_policy_set(ROOT / "policies")
    seen: set[str] = set()
    for root, ledger in sorted((r, ledger) for r in roots for ledger in r.rglob("ledger.db")):
        database = ledger.parent / "jobgate.db"
        if not database.is_file():
            continue
        try:
            engine = EmbeddedEngine(policy_set, bindings_of(database))
            store = open_store(f"sqlite:///{ledger}", create=False)
        except Exception as e:  # a test's deliberately broken store: not a source of decisions
            print(f"skipped {ledger}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        try:
            rows = list(store.iter_entries())
        finally:
            store.close()
        for row in rows:
            entry = json.loads(row[2])
            body = entry.get("body") or {}
            decision = body.get("decision") or {}
            request = body.get("input")
            if (entry.get("kind") != "decision" or body.get("policy_hash") != policy_set.hash or body.get("bypass")
                    or not isinstance(request, dict) or set(decision.get("rules") or ()) & NOT_BY_POLICY):
                continue
            now = engine.decide(request).to_json()
            if any(now[k] != decision.get(k) for k in ("effect", "rules", "approvals_required")):
                continue  # decided with bindings other than the DB's last ones
            doc = engine.decision_input(request)
            key = json.dumps(doc, sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            yield {"seq": entry["seq"], "ledger": str(ledger.relative_to(root).parent), "input": doc,
                   "effect": decision["effect"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="The .jsonl.gz to write.")
    parser.add_argument("roots", type=Path, nargs="+", help="Directories holding the tests' data dirs (--basetemp).")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    kept = list(harvest(args.roots))
    lines = "".join(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n" for record in kept)
    with args.out.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as f:
        f.write(lines.encode())  # mtime 0: the same decisions make the same bytes
    actions: dict[str, int] = {}
    for record in kept:
        actions[record["input"]["action"]] = actions.get(record["input"]["action"], 0) + 1
    print(json.dumps({"kept": len(kept), "actions": dict(sorted(actions.items()))}, indent=1))


if __name__ == "__main__":
    main()
