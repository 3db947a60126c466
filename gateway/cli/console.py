"""CLI twins of the console's pages, so everything the console shows has a command with `--json`:
`jobgate stats usage|waits|fragmentation|suggestions`, `jobgate notifications`, `jobgate audit
entries|show|export`, `jobgate policy show`. Registered on the command tree in gateway/cli/main.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import httpx

from gateway.cli.client import Client, ClientGroup, api_path, client_options, emit_json, fail, table

_json = click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")


def _progress(text: str) -> None:
    """One self-overwriting status line on stderr, only when a person watches (stderr is a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + text.ljust(60))
        sys.stderr.flush()


def _progress_done() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
        sys.stderr.flush()


# -- jobgate stats ... (added to the scheduler's `stats` group) ---------------------------------------


@click.command("usage")
@click.option("--days", type=click.IntRange(1, 92), default=7, show_default=True, help="Days in the heat map.")
@_json
@click.pass_obj
def stats_usage(client: Client, days: int, as_json: bool) -> None:
    """Cluster usage now and quota utilisation per tenant and day (the console's heat map)."""
    data = client.request("GET", "stats", "usage", params={"days": days})
    if as_json:
        emit_json(data)
        return
    c = data["cluster"]
    click.echo(f"cluster: {c['in_use']} of {c['gpus']} GPUs in use, {c['free']} free")
    click.echo(table(c["tenants"], [("tenant", "tenant"), ("owned", "owned"), ("borrowed", "borrowed"),
                                    ("quota_gpus", "quota")]))
    heat = data["heatmap"]
    rows = [{"tenant": r["tenant"], **{c2["day"][5:]: f"{c2['utilisation'] * 100:.0f}%" for c2 in r["cells"]}}
            for r in heat["rows"]]
    click.echo("\nquota utilisation (GPU-hours ÷ quota × 24 h):")
    click.echo(table(rows, [("tenant", "tenant"), *((d[5:], d[5:]) for d in heat["days"])]))


@click.command("waits")
@_json
@click.pass_obj
def stats_waits(client: Client, as_json: bool) -> None:
    """Wait-time distribution per queue (submitted → started) and the jobs waiting now."""
    data = client.request("GET", "stats", "waits")
    if as_json:
        emit_json(data)
        return
    labels = data["bucket_labels"]
    rows = [{"queue": q, **w["buckets"], "p50": w["p50_s"], "p90": w["p90_s"], "waiting": w["waiting_now"],
             "oldest": w["oldest_wait_s"]} for q, w in data["queues"].items()]
    click.echo(table(rows, [("queue", "queue"), *((b, b) for b in labels), ("p50", "p50 s"), ("p90", "p90 s"),
                            ("waiting", "waiting"), ("oldest", "oldest s")]))


@click.command("fragmentation")
@_json
@click.pass_obj
def stats_fragmentation(client: Client, as_json: bool) -> None:
    """Free GPUs per node and the fragmentation index (0: all free GPUs on one node)."""
    data = client.request("GET", "stats", "fragmentation")
    if as_json:
        emit_json(data)
        return
    click.echo(f"{data['free_gpus']} free GPUs on {data['nodes_with_free_gpus']} node(s); largest free block"
               f" {data['largest_free_block']}; fragmentation {data['fragmentation']}")
    click.echo(table(data["nodes"], [("node", "node"), ("state", "state"), ("gpus", "gpus"), ("used", "used"),
                                     ("free", "free")]))


@click.command("suggestions")
@_json
@click.pass_obj
def stats_suggestions(client: Client, as_json: bool) -> None:
    """Suggested adjustments: idle quota, stale reservations, starved tenants."""
    data = client.request("GET", "stats", "suggestions")
    if as_json:
        emit_json(data)
        return
    if not data["suggestions"]:
        click.echo("nothing to adjust right now")
    for s in data["suggestions"]:
        click.echo(f"- {s['kind'].replace('_', ' ')}: {s['text']}")


STATS_COMMANDS = (stats_usage, stats_waits, stats_fragmentation, stats_suggestions)


# -- jobgate notifications ----------------------------------------------------------------------------


def _clip(text: str, width: int = 100) -> str:
    """At most `width` characters, cut after a whole key=value, with an ellipsis if anything was left out
    (`--json` has it all)."""
    if len(text) <= width:
        return text
    cut = text.rfind(", ", 0, width - 1)
    return (text[:cut] if cut > 0 else text[:width - 1]) + " …"


@click.command("notifications")
@client_options
@click.option("--ack", "ack_id", metavar="ID", help="Acknowledge this notice (the receipt the ledger records).")
@_json
def notifications_cmd(gateway: str, token: str | None, trigger: str | None, ack_id: str | None,
                      as_json: bool) -> None:
    """Your notices, newest first: preemptions (why, when you may run again, checkpoint state), stops of
    your jobs, approval requests. `--ack ID` acknowledges one."""
    client = Client(gateway, token, trigger)
    if ack_id:
        note = client.request("POST", "notifications", ack_id, "ack")
        emit_json(note) if as_json else click.echo(f"{ack_id}: {note['receipt']}")
        return
    data = client.request("GET", "notifications")
    if as_json:
        emit_json(data)
        return
    rows = [{"id": n["id"], "at": n["created_at"][:19], "kind": n["kind"], "receipt": n["receipt"],
             "details": _clip(", ".join(f"{k}={v}" for k, v in n["body"].items()))} for n in data["notifications"]]
    click.echo(table(rows, [("at", "when"), ("kind", "what"), ("receipt", "receipt"), ("id", "id"),
                            ("details", "details")]))


# -- jobgate audit ------------------------------------------------------------------------------------


@click.group("audit", cls=ClientGroup)
def audit_group() -> None:
    """Browse the ledger through the gateway (needs ledger.read): search, one entry with its proof
    verified, and an export bundle. For offline checks of a data dir use `jobgate ledger`."""


@audit_group.command("entries")
@click.option("--job", help="Entries naming this job.")
@click.option("--actor", help="Entries by this person (or service account, or approver).")
@click.option("--action", help="e.g. job.stop")
@click.option("--effect", help="allow, deny, needs_approval, or an outcome result (executed, rejected, ...).")
@click.option("--kind", help="decision, outcome, transition, receipt, ...")
@click.option("--since", help="ISO 8601 time (UTC if no zone).")
@click.option("--until", help="ISO 8601 time.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True, help="Most entries.")
@_json
@click.pass_obj
def audit_entries(client: Client, job: str | None, actor: str | None, action: str | None, effect: str | None,
                  kind: str | None, since: str | None, until: str | None, limit: int, as_json: bool) -> None:
    """Search ledger entries, newest first. Pages through the whole ledger if needed, with progress."""
    params: dict[str, Any] = {k: v for k, v in {"job": job, "actor": actor, "action": action, "effect": effect,
                                                "kind": kind, "since": since, "until": until}.items() if v}
    found: list[dict[str, Any]] = []
    before: int | None = None
    while len(found) < limit:
        page = client.request("GET", "audit", "entries",
                              params={**params, "limit": min(500, limit - len(found)),
                                      **({"before": before} if before is not None else {})})
        found += page["entries"]
        before = page["next_before"]
        _progress(f"searched back to entry {page['scanned_to']} of {page['size']}, {len(found)} found")
        if before is None:
            break
    _progress_done()
    if as_json:
        emit_json({"entries": found})
        return
    rows = [{**e, "time": e["time"][:19], "actors": ",".join(dict.fromkeys(e["actors"])),
             "jobs": ",".join(e["jobs"]), "effect": "/".join(x for x in (e["effect"], e["result"]) if x)}
            for e in found]
    click.echo(table(rows, [("seq", "seq"), ("time", "time"), ("kind", "kind"), ("action", "action"),
                            ("effect", "effect"), ("actors", "actors"), ("jobs", "jobs")]))


@audit_group.command("show")
@click.argument("seq", type=click.IntRange(0))
@_json
@click.pass_obj
def audit_show(client: Client, seq: int, as_json: bool) -> None:
    """One entry with its inclusion proof, checked against the latest signed checkpoint. Exits 1 if the
    proof does not verify."""
    d = client.request("GET", "audit", "entries", seq)
    if as_json:
        emit_json(d)
    else:
        s = d["summary"]
        click.echo(f"entry {d['seq']}  {s['kind']} {s['action']}  {s['effect'] or s['result']}  at {s['time']}")
        click.echo(f"  actors: {', '.join(dict.fromkeys(s['actors'])) or '-'}; jobs: {', '.join(s['jobs']) or '-'}")
        click.echo(f"  hash {d['hash']}")
        click.echo(f"  checkpoint: size {d['checkpoint_size']}, root {d['checkpoint_root']},"
                   f" signature {d['checkpoint_signature']}")
        click.echo(f"  inclusion proof {d['verdict']}")
    if not d["verified"]:
        fail(f"entry {seq}: {d['verdict']}")


@audit_group.command("checkpoint")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Save it to this file (otherwise it is printed).")
@click.pass_obj
def audit_checkpoint(client: Client, out: Path | None) -> None:
    """The ledger's latest signed checkpoint (a C2SP signed note). Keep it: `jobgate ledger verify
    --trusted-checkpoint FILE` later catches a history rewritten or cut short since, even if re-signed."""
    note = client.request("GET", "ledger", "checkpoint")
    if not isinstance(note, str) or "\n\n" not in note:
        fail("the gateway's answer is not a signed checkpoint")
    if out is None:
        click.echo(note, nl=False)
        return
    try:
        out.write_text(note, encoding="utf-8")
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")
    click.echo(f"saved the checkpoint at tree size {note.splitlines()[1]} to {out}")


@audit_group.command("export")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Bundle file to write.")
@_json
@click.pass_obj
def audit_export(client: Client, out: Path, as_json: bool) -> None:
    """Download a bundle of every signed entry (the console's export button), with progress. Verify it with
    `jobgate ledger verify --bundle FILE --public-key <data-dir>/keys/ledger.vkey`."""
    tmp = out.with_name(out.name + ".part")
    written = 0
    try:
        with client.http.stream("GET", api_path("audit", "export")) as r:
            if r.status_code >= 400:
                r.read()
                try:
                    detail = r.json().get("detail")
                except ValueError:
                    detail = r.text[:300]
                fail(f"{r.status_code} {detail}")
            with tmp.open("wb") as f:
                for chunk in r.iter_bytes(1 << 16):
                    f.write(chunk)
                    written += len(chunk)
                    _progress(f"downloaded {written / 1e6:.1f} MB")
        tmp.replace(out)
    except httpx.HTTPError as e:
        fail(f"cannot reach the gateway at {client.url} ({e.__class__.__name__}: {e})")
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")
    finally:
        _progress_done()
        tmp.unlink(missing_ok=True)
    if as_json:
        emit_json({"path": str(out), "bytes": written})
    else:
        click.echo(f"Wrote {out} ({written} bytes); verify with"
                   f" `jobgate ledger verify --bundle {out} --public-key <data-dir>/keys/ledger.vkey`")


# -- jobgate policy show (added to the policy group) --------------------------------------------------


@click.command("show")
@_json
@click.pass_obj
def policy_show(client: Client, as_json: bool) -> None:
    """The gateway's active policy set: its hash, engine, load time, and the reload history with errors."""
    data = client.request("GET", "policy")
    if as_json:
        emit_json(data)
        return
    click.echo(f"policy {data['policy_hash']}  engine {data['engine']}  loaded {data['loaded_at']}")
    click.echo(f"directory {data['directory']}")
    rows = [{**h, "at": h["at"][:19], "hash": (h.get("policy_hash") or "")[:16],
             "errors": "; ".join(h.get("errors", []))[:120]} for h in data["history"]]
    click.echo(table(rows, [("at", "at"), ("trigger", "trigger"), ("by", "by"), ("result", "result"),
                            ("hash", "hash"), ("errors", "errors")]))
