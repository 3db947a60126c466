"""`jobgate policy explain` on a break-glass call's ledger entry compares today's policy answer with the policy's
answer then (`policy_decision`), not with the override the gateway applied to it: an unchanged set and unchanged
bindings were reported as "DIFFERS ... other role bindings or another policy set"."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from test_policy_whatif_breakglass import break_glass_stops

from gateway.cli.main import cli
from gateway.context import Gateway
from gateway.settings import Settings


def ledger_entry(data_dir: Path, seq: int) -> dict[str, object]:
    from gateway.bootstrap import open_gateway

    gw: Gateway = open_gateway(Settings(data_dir=data_dir, policy_watch_interval_s=0))
    try:
        value: dict[str, object] = gw.ledger.entry(seq).value
        return value
    finally:
        gw.ledger.close()
        gw.db.engine.dispose()


def test_explain_of_a_break_glass_allow_under_the_same_set_says_the_same(tmp_path: Path) -> None:
    data = tmp_path / "var"
    decisions = break_glass_stops(data)
    assert decisions["plain"]["effect"] == "allow" and "F2.break_glass" in decisions["plain"]["rules"]
    entry = tmp_path / "entry.json"
    entry.write_text(json.dumps(ledger_entry(data, decisions["plain"]["ledger_seq"])))
    result = CliRunner().invoke(cli, ["policy", "explain", "--input", str(entry), "--data-dir", str(data), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["differs"] is False, report
    assert report["recorded"]["effect"] == "needs_approval"  # the policy's own answer; the grant stood in for one
    text = CliRunner().invoke(cli, ["policy", "explain", "--input", str(entry), "--data-dir", str(data)]).output
    assert "recorded then (the policy's answer, before the break-glass override): NEEDS_APPROVAL" in text, text
    assert "the same as now" in text
