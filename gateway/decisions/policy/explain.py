"""Explain one decision: the decision plus every rule that fired, why, and where it is written.

The decision comes from the same engine as at run time (EmbeddedEngine.decide). The explanation reads the
intermediate rules of package jobgate.authz on the same input: `findings` (one per subject, each with its
rule and sentence), `denials`, `needs` (approvals required and still missing per subject) and
`notches_fired` (R3 / H2 / C2 raising the count). Each rule id is located in the Rego sources as
`file:line`, so a reviewer can open the rule that decided.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.decisions.policy.engine import EmbeddedEngine
from gateway.decisions.policy.loader import compile_rego, first_value
from gateway.decisions.policy.regoio import rego_input, set_input

PARTS = ("findings", "denials", "needs", "notches_fired")


def locate_rules(modules: Mapping[str, str], rule_ids: set[str]) -> dict[str, str]:
    """rule id -> "file:line" of its first quoted occurrence in the Rego sources."""
    found: dict[str, str] = {}
    for name, source in sorted(modules.items()):
        for rule in rule_ids - found.keys():
            m = re.search(r'"' + re.escape(rule) + r'"', source)
            if m:
                found[rule] = f"{name}:{source.count(chr(10), 0, m.start()) + 1}"
    return found


def explain(engine: EmbeddedEngine, request: Mapping[str, Any]) -> dict[str, Any]:
    """Decision, full input (with capabilities) and the rules behind it. Raises KeyError/TypeError on a
    request without an actor (the decision alone would be a fail-closed deny)."""
    decision = engine.decide(request)
    doc = engine.decision_input(request)
    rego, bundle = compile_rego(engine.policy_set.rego_modules, engine.policy_set.data,
                                entrypoints=[f"jobgate/authz/{p}" for p in PARTS])
    set_input(rego, rego_input(doc))
    parts: dict[str, Any] = {}
    for part in PARTS:
        try:
            parts[part] = first_value(rego.query_bundle_entrypoint(bundle, f"jobgate/authz/{part}")) or []
        except ValueError as e:
            parts[part] = {"error": str(e)}
    ids = {str(x.get("rule")) for p in PARTS if isinstance(parts[p], list) for x in parts[p] if isinstance(x, dict)}
    ids |= set(decision.rules)
    where = locate_rules(engine.policy_set.rego_modules, ids)
    fired = []
    for f in parts["findings"] if isinstance(parts["findings"], list) else []:
        fired.append({"rule": f.get("rule"), "kind": f.get("kind"), "subject": f.get("subject"),
                      "why": f.get("reason"), "second_persons_by_rule": f.get("base", 0),
                      "where": where.get(f.get("rule"))})
    for d in parts["denials"] if isinstance(parts["denials"], list) else []:
        if not any(x["rule"] == d.get("rule") and x["kind"] == "deny" for x in fired):
            fired.append({"rule": d.get("rule"), "kind": "guard", "subject": None, "why": d.get("reason"),
                          "where": where.get(d.get("rule"))})
    for n in parts["notches_fired"] if isinstance(parts["notches_fired"], list) else []:
        fired.append({"rule": n.get("rule"), "kind": "notch", "subject": None, "why": n.get("reason"),
                      "where": where.get(n.get("rule"))})
    return {
        "decision": decision.to_json(),
        "fired": fired,
        "approvals": parts["needs"],
        "capabilities": doc.get("granted", {}),
        "roles": doc["actor"].get("roles", {}),
        "input": doc,
    }


def render(result: Mapping[str, Any]) -> str:
    """Human-readable explanation."""
    d = result["decision"]
    lines = [f"decision: {d['effect'].upper()}   (policy {d['policy_hash'][:12]})"]
    for reason in d["reasons"]:
        lines.append(f"  reason: {reason}")
    lines.append("")
    lines.append("rules that fired:")
    for f in result["fired"]:
        subject = f" [{f['subject']}]" if f.get("subject") else ""
        lines.append(f"  {f['rule']:<34} {f['kind']:<6}{subject}  at {f.get('where') or '?'}")
        lines.append(f"      why: {f['why']}")
    approvals = result["approvals"]
    if isinstance(approvals, list) and approvals:
        lines.append("")
        lines.append("second persons (M2):")
        for n in approvals:
            e = n.get("eligible", {})
            lines.append(f"  {n.get('subject')}: {n.get('required')} required, {n.get('missing')} missing;"
                         f" eligible roles {e.get('roles')} in {e.get('projects')}, people {e.get('principals')}")
    if d["obligations"]:
        lines.append("")
        lines.append("obligations: " + ", ".join(str(o.get("kind")) for o in d["obligations"]))
    lines.append("")
    lines.append("capabilities (Casbin, per project): " + "; ".join(
        f"{p}: {', '.join(c) or '-'}" for p, c in result["capabilities"].items()))
    return "\n".join(lines)
