"""The console's charts of insights' figures (Q10, Q11): the quota heat map, the wait before starting per queue
and GPUs in use over the last hours, as inline SVG (gateway/console/charts.py) ready for a template: Markup,
since charts escapes every text it draws."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from markupsafe import Markup

from gateway.console import charts
from gateway.console.wording import duration, number


def _day(iso: str) -> str:
    d = date.fromisoformat(iso)
    return f"{d.strftime('%a')} {d.day}"


def quota_heatmap(heat: dict[str, Any]) -> Markup:
    """insights.heatmap: each tenant's share of its quota per UTC day, coloured by it."""
    rows = []
    for r in heat["rows"]:
        note = (f"quota {r['quota_gpus']} GPUs" if r["quota_gpus"] is not None
                else f"no quota: of all {r['measured_against']} GPUs")
        titles = [f"{r['tenant']} on {c['day']}: {number(c['gpu_hours'])} GPU-hours, {charts.percent(c['utilisation'])}"
                  f" of {r['measured_against']} GPUs × the day's hours" for c in r["cells"]]
        rows.append(charts.HeatRow(r["tenant"], note, [c["utilisation"] for c in r["cells"]], titles))
    return Markup(charts.heatmap(rows, [_day(d) for d in heat["days"]],
                                 title="Quota use per tenant and UTC day"))


def wait_histograms(waits: dict[str, Any]) -> Markup:
    """insights.waits: per queue, how long started jobs waited, in buckets, with the median and 90th percentile."""
    panels = []
    for queue, w in waits["queues"].items():
        started = f"{w['started']} started" + (f": median {duration(w['p50_s'])}, p90 {duration(w['p90_s'])}"
                                                if w["p50_s"] is not None else "")
        waiting = (f"{w['waiting_now']} waiting now" + (f", the oldest for {duration(w['oldest_wait_s'])}"
                                                        if w["oldest_wait_s"] else "")) if w["waiting_now"] else ""
        panels.append(charts.Bars(queue, "\n".join(filter(None, (started, waiting))),
                                  [w["buckets"][b] for b in waits["bucket_labels"]]))
    return Markup(charts.bar_panels(panels, waits["bucket_labels"],
                                    title="Wait before starting, per queue", empty="no job started yet"))


def usage_timeline(use: dict[str, Any], width: float = 720) -> Markup:
    """insights.usage_over_time: GPUs in use per tenant, hour by hour, under the cluster's GPUs."""
    steps = [datetime.fromisoformat(h).strftime("%H:00") for h in use["hours"]]
    series = [charts.Series(t["tenant"], t["gpus_in_use"]) for t in use["tenants"]]
    return Markup(charts.stacked_area(series, steps, unit="GPUs in use", capacity=use["gpus"] or None,
                                      capacity_label=f"all {use['gpus']} GPUs", width=width,
                                      title=f"GPUs in use per tenant, the last {len(steps)} hours (UTC)"))
