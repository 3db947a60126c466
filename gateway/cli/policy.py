"""`jobgate policy ...`: tools for the security reviewers who own policies/ — no server needed.

  check    compile everything and run the set's own tests, as a reload does; problems as `file:line: message`;
           exit 1 on any
  test     Rego `test_` rules + YAML table cases, pass/fail per case, coverage of rows A1-A8; exit 1 on failure
  explain  the decision for one request with every rule that fired, why, and where it is written
  whatif   replay the decisions recorded in the ledger under a candidate set; list every flip, with counts
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from gateway.cli.client import ClientGroup, emit_json, fail, table
from gateway.decisions.policy.engine import EmbeddedEngine, RoleBinding
from gateway.decisions.policy.errors import PolicyError, PolicyLoadError
from gateway.decisions.policy.loader import load_policy_set, lookalike_roles
from gateway.settings import REPO_POLICIES
from ledger.cli import end_progress_bar, progress_bar

_dir_arg = click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))


def _policy_dir(directory: Path | None) -> Path:
    path = directory or REPO_POLICIES
    if not path.is_dir():
        fail(f"policy directory {path} does not exist")
    return path


def _bindings_file(path: Path) -> list[RoleBinding]:
    """`g, principal, role, project` lines (the format of policies/tests/bindings.csv)."""
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        fail(f"cannot read bindings file {path}: {e.strerror or e}")
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or fields[0] != "g" or not all(fields[1:]):
            fail(f"{path}:{number}: expected `g, principal, role, project`")
        out.append(RoleBinding(fields[1], fields[2], fields[3]))
    return out


@click.group("policy", cls=ClientGroup, offline=("check", "test", "explain", "whatif"))
def policy_group() -> None:
    """Check, test, explain and what-if the policy set (policies/): no server needed. `show` asks the gateway
    which set it runs (--gateway and --token are for it)."""


@policy_group.command("check")
@_dir_arg
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too (a role that looks like a misspelt one).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def check_cmd(directory: Path | None, strict: bool, as_json: bool) -> None:
    """Compile DIRECTORY (default: the repository's policies/) and run its own tests, as the gateway's reload
    does; report every problem as file:line, and warnings (a matrix role named nearly like another, likely a
    typo) the set would still be accepted with."""
    from gateway.decisions.policy.testing import load_tested_set

    path = _policy_dir(directory)
    try:
        ps = load_tested_set(path)
    except PolicyLoadError as e:
        if as_json:
            emit_json({"ok": False, "directory": str(path), "errors": [str(p) for p in e.errors]})
        else:
            for p in e.errors:
                click.echo(str(p))
            click.echo(f"{len(e.errors)} problem(s); the set would be refused", err=True)
        raise SystemExit(1) from None
    roles = sorted({r.role for r in ps.matrix})
    warnings = [str(w) for w in lookalike_roles(ps.matrix)]
    summary = {"ok": True, "directory": str(path), "policy_hash": ps.hash, "rego_modules": sorted(ps.rego_modules),
               "matrix_rows": len(ps.matrix), "roles": roles, "warnings": warnings}
    if as_json:
        emit_json(summary)
    else:
        for w in warnings:
            click.echo(f"warning: {w}")
        click.echo(f"ok {ps.hash}  ({len(ps.rego_modules)} Rego modules, {len(ps.matrix)} matrix rows, "
                   f"roles: {', '.join(roles)})")
    if warnings and strict:
        raise SystemExit(1)


@policy_group.command("test")
@_dir_arg
@click.option("--json", "as_json", is_flag=True, help="Print results as JSON.")
@click.option("--failures-only", is_flag=True, help="Print only failing cases.")
def test_cmd(directory: Path | None, as_json: bool, failures_only: bool) -> None:
    """Run DIRECTORY's Rego `test_` rules and YAML table cases (tests/*.yaml); print pass/fail per case and
    which effects each matrix row A1-A8 is tested with. Exit 1 on a failure or a coverage gap."""
    from gateway.decisions.policy.testing import coverage, coverage_gaps, load_table_cases, run_rego_tests, run_table

    path = _policy_dir(directory)
    try:
        ps = load_policy_set(path)
        cases = load_table_cases(path)
        table_results = run_table(ps, cases)
        rego_results = run_rego_tests(ps)
    except PolicyLoadError as e:
        for p in e.errors:
            click.echo(str(p))
        raise SystemExit(1) from None
    cov = coverage(cases)
    gaps = coverage_gaps(cov)
    failed = [r for r in table_results if not r.passed] + [r for r in rego_results if not r.passed]
    if as_json:
        emit_json({
            "policy_hash": ps.hash,
            "cases": [{"name": r.case.name, "row": r.case.row, "where": f"{r.case.file}:{r.case.line}",
                       "passed": r.passed, "failures": list(r.failures)} for r in table_results],
            "rego_tests": [{"name": r.name, "where": f"{r.file}:{r.line}", "passed": r.passed, "detail": r.detail}
                           for r in rego_results],
            "coverage": cov, "gaps": gaps, "failed": len(failed),
        })
    else:
        for tr in table_results:
            if tr.passed and failures_only:
                continue
            click.echo(f"{'PASS' if tr.passed else 'FAIL'}  {tr.case.row:<7} {tr.case.name}")
            for line in tr.failures:
                click.echo(f"        {tr.case.file}:{tr.case.line}: {line}")
        for rr in rego_results:
            if rr.passed and failures_only:
                continue
            click.echo(f"{'PASS' if rr.passed else 'FAIL'}  rego    {rr.name}")
            if not rr.passed:
                click.echo(f"        {rr.file}:{rr.line}: {rr.detail}")
        click.echo("")
        click.echo("coverage of the action matrix (effects with at least one case):")
        for row in ("A1", "A2", "A3", "A4", "A5", "A6", "A7", "A8"):
            click.echo(f"  {row}  {', '.join(cov.get(row, [])) or 'NONE'}")
        for gap in gaps:
            click.echo(f"  gap: {gap}")
        total = len(table_results) + len(rego_results)
        click.echo(f"\n{total - len(failed)} passed, {len(failed)} failed ({len(table_results)} table cases, "
                   f"{len(rego_results)} Rego tests)")
    if failed or gaps:
        raise SystemExit(1)


@policy_group.command("explain")
@click.option("--input", "input_file", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="JSON: a decision input (as recorded in a ledger entry's body.input), a whole ledger entry "
                   "(`jobgate audit show SEQ --json` > FILE), or a compact table case input.")
@click.option("--bindings", "bindings_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Role bindings, `g, principal, role, project` per line (e.g. DIR/tests/bindings.csv, the"
                   " policy tests' fixture).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Use a gateway's current role bindings, read from DATA_DIR/jobgate.db. Default: those of"
                   " JOBGATE_DATABASE_URL if set, else of JOBGATE_DATA_DIR (var) if it holds a business DB, else"
                   " the policy tests' fixture; the first line says which.")
@click.option("--database-url", help="Use the current role bindings of this business DB.")
@click.option("--policies", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Policy directory (default: the repository's policies/).")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def explain_cmd(input_file: Path, bindings_file: Path | None, data_dir: Path | None, database_url: str | None,
                directory: Path | None, as_json: bool) -> None:
    """Decide one request and show every rule that fired, why, and where it is written.

    The role bindings are by default those of the gateway beside it (JOBGATE_DATABASE_URL, or the business DB
    in JOBGATE_DATA_DIR, default var), and the first line names them. Given a decision's ledger entry, it also
    shows the decision recorded then, and says so when today's answer differs: other role bindings or another
    policy set."""
    from gateway.decisions.policy.explain import explain, render
    from gateway.decisions.policy.testing import BINDINGS_FILE, expand_input

    path = _policy_dir(directory)
    try:
        doc = json.loads(input_file.read_text(encoding="utf-8"))
    except OSError as e:
        fail(f"cannot read {input_file}: {e.strerror or e}")
    except json.JSONDecodeError as e:
        fail(f"{input_file}:{e.lineno}: not JSON ({e.msg})")
    if isinstance(doc, dict) and isinstance(doc.get("entry"), dict):
        doc = doc["entry"]  # `jobgate audit show SEQ --json` (GET /v1/audit/entries/{seq}): the entry and its proof
    recorded = None
    overridden = False
    if isinstance(doc, dict) and isinstance(doc.get("body"), dict) and "input" in doc["body"]:
        overridden = isinstance(doc["body"].get("policy_decision"), dict)
        # A break-glass call records the policy's own answer beside the override the gateway applied to it
        # (pipeline.decide); the policy's answer is what today's decision below is compared with.
        said = doc["body"].get("policy_decision") or doc["body"].get("decision")
        recorded = said if isinstance(said, dict) else None
        doc = doc["body"]["input"]  # a whole ledger entry
    if not isinstance(doc, dict) or "action" not in doc or "actor" not in doc:
        fail(f"{input_file} must hold an object with at least `action` and `actor` (a decision input), or a"
             " decision's ledger entry, e.g. from `jobgate audit show SEQ --json`")
    if isinstance(doc["actor"], str) or any("creator" not in t for t in doc.get("targets") or []):
        doc = expand_input(doc)  # compact, as in policies/tests/*.yaml
    if sum(x is not None for x in (bindings_file, data_dir, database_url)) > 1:
        fail("give at most one of --bindings, --data-dir and --database-url")
    if data_dir is not None:
        if not (data_dir / "jobgate.db").is_file():
            fail(f"no business database at {data_dir / 'jobgate.db'} (is {data_dir} a gateway's data dir?)")
        database_url = f"sqlite:///{data_dir.resolve() / 'jobgate.db'}"
    why_fixture = ""
    if bindings_file is None and database_url is None:
        database_url, why_fixture = _gateway_beside()
    if database_url is not None:
        from gateway.cli.up import _without_password

        bindings = _current_bindings(database_url)
        source = f"current bindings of {_without_password(database_url)} ({len(bindings)} bindings)"
    elif bindings_file is not None:
        bindings = _bindings_file(bindings_file)
        source = f"{bindings_file} ({len(bindings)} bindings)"
    else:
        fixture = path / "tests" / BINDINGS_FILE
        bindings = _bindings_file(fixture)
        source = (f"{fixture} (the policy tests' fixture, not a gateway's: {why_fixture}; --data-dir or"
                  " --database-url reads a gateway's)")
    try:
        engine = EmbeddedEngine(load_policy_set(path), bindings)
        result = explain(engine, doc)
    except PolicyError as e:
        fail(e.diagnostics())
    except (KeyError, TypeError) as e:
        fail(f"{input_file}: malformed request ({type(e).__name__}: {e})")
    differs = recorded is not None and (recorded.get("effect"), list(recorded.get("rules") or [])) != (
        result["decision"]["effect"], list(result["decision"]["rules"]))
    if as_json:
        emit_json({**result, "bindings": source, **({"recorded": recorded, "differs": differs} if recorded else {})})
        return
    # First: a decision read under other bindings than the reader assumed would mislead from its first word.
    click.echo(f"bindings: {source}")
    click.echo(render(result))
    if recorded is not None:
        then = "recorded then (the policy's answer, before the break-glass override)" if overridden else "recorded then"
        click.echo(f"{then}: {str(recorded.get('effect')).upper()} ({', '.join(recorded.get('rules') or [])})"
                   + ("; DIFFERS from the answer above: other role bindings or another policy set" if differs
                      else "; the same as now"))


def _parse_since(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        fail(f"--since {value!r} is not an ISO date or date-time (e.g. 2026-11-29 or 2026-11-29T10:00:00Z)")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _gateway_beside() -> tuple[str | None, str]:
    """The business DB a gateway started here would use (JOBGATE_DATABASE_URL, else jobgate.db in
    JOBGATE_DATA_DIR, default var), if there is one; else None and why not, in words."""
    url = os.environ.get("JOBGATE_DATABASE_URL")
    if url:
        return url, ""
    data_dir = Path(os.environ.get("JOBGATE_DATA_DIR") or "var")
    db_file = data_dir.resolve() / "jobgate.db"
    if db_file.is_file():
        return f"sqlite:///{db_file}", ""
    return None, f"no gateway data dir here ({db_file} does not exist)"


def _current_bindings(database_url: str) -> list[RoleBinding]:
    from sqlalchemy import create_engine, select
    from sqlalchemy.exc import SQLAlchemyError
    from sqlalchemy.orm import Session

    from gateway.store.db import sqlalchemy_url
    from gateway.store.models import RoleBinding as Row

    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with Session(engine) as session:
            return [RoleBinding(r.principal_id, r.role, r.project) for r in session.scalars(select(Row)).all()]
    except SQLAlchemyError as e:
        fail(f"cannot read role bindings from {database_url}: {e.__class__.__name__}: {str(e).splitlines()[0]}")
    finally:
        engine.dispose()


@policy_group.command("whatif")
@click.option("--policies", "candidate", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="The candidate policy directory.")
@click.option("--since", help="Only decisions recorded at or after this ISO date/date-time (UTC).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
              help="A gateway data dir: ledger.db is replayed, role bindings are read from jobgate.db.")
@click.option("--ledger-url", help="Ledger store URL (sqlite:///abs/ledger.db or postgresql://...).")
@click.option("--database-url", help="Business DB URL for the current role bindings (with --ledger-url).")
@click.option("--bindings", "bindings_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Replay with this bindings snapshot (`g, principal, role, project`) instead of the DB's.")
@click.option("--workers", type=click.IntRange(1, 64), help="Replay processes (default: one per CPU).")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(0), help="Flips listed (text output).")
@click.option("--json", "as_json", is_flag=True, help="Every flip and the counts as JSON.")
def whatif_cmd(candidate: Path, since: str | None, data_dir: Path | None, ledger_url: str | None,
               database_url: str | None, bindings_file: Path | None, workers: int | None, limit: int,
               as_json: bool) -> None:
    """Replay the decision inputs recorded in the ledger under CANDIDATE and list every decision that
    would flip (allow→deny, deny→allow, needs_approval changes, approvals count changes), with counts.

    Each recorded input is replayed exactly as stored, with capabilities computed from role bindings:
    by default the CURRENT bindings of the business DB (so a flip can also come from a binding changed
    since the decision), or the snapshot given with --bindings. The report names which."""
    from gateway.decisions.policy.whatif import records_from_entries, replay
    from ledger.errors import LedgerError
    from ledger.store import open_store

    if (data_dir is None) == (ledger_url is None):
        fail("give exactly one of --data-dir or --ledger-url")
    if data_dir is not None:
        ledger_file = data_dir.resolve() / "ledger.db"
        if not ledger_file.is_file():
            fail(f"no ledger database at {ledger_file}")
        ledger_url = f"sqlite:///{ledger_file}"
        database_url = database_url or f"sqlite:///{data_dir.resolve() / 'jobgate.db'}"
    if not candidate.is_dir():
        fail(f"candidate policy directory {candidate} does not exist")
    if bindings_file is not None:
        bindings = _bindings_file(bindings_file)
        source = f"snapshot {bindings_file} ({len(bindings)} bindings)"
    elif database_url:
        bindings = _current_bindings(database_url)
        source = f"current business DB {database_url} ({len(bindings)} bindings)"
    else:
        fail("with --ledger-url give --database-url (current bindings) or --bindings FILE (a snapshot)")
    assert ledger_url is not None
    try:
        store = open_store(ledger_url, create=False)
        try:
            records = list(records_from_entries((row[2] for row in store.iter_entries()), _parse_since(since)))
        finally:
            store.close()
        progress = progress_bar("replaying")
        try:
            report = replay(candidate, records, bindings, bindings_source=source, workers=workers,
                            progress=progress)
        finally:
            end_progress_bar(progress)
    except LedgerError as e:
        fail(f"cannot read the ledger: {e}")
    except PolicyError as e:
        fail(e.diagnostics())
    if as_json:
        emit_json(report.to_json())
        return
    click.echo(f"candidate {report.candidate_hash[:12]} ({candidate})")
    click.echo(f"bindings: {source}")
    click.echo(f"replayed {report.replayed} decisions ({report.unique_inputs} distinct inputs) in "
               f"{report.seconds:.2f} s; {report.skipped} skipped (decided before the policy: token scope, "
               f"rate limit)")
    rows: list[dict[str, Any]] = [
        {"seq": f.seq, "time": f.time[:19], "actor": f.actor, "action": f.action,
         "targets": ",".join(f.targets)[:40], "flip": f.kind, "now": ", ".join(f.after["rules"])[:50]}
        for f in report.flips[:limit]
    ]
    if report.flips:
        click.echo("")
        click.echo(table(rows, [("seq", "seq"), ("time", "time"), ("actor", "actor"), ("action", "action"),
                                ("targets", "targets"), ("flip", "flip"), ("now", "rules now")]))
        if len(report.flips) > limit:
            click.echo(f"... {len(report.flips) - limit} more (use --limit or --json)")
    click.echo("")
    click.echo(f"{len(report.flips)} decision(s) would flip" + (":" if report.flips else ""))
    for kind, n in report.counts().items():
        click.echo(f"  {kind:<28} {n}")
