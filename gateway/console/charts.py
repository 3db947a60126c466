"""Charts as inline SVG, drawn on the server from plain numbers: a heat map (quota use per tenant and day), bar
charts side by side (wait-time distribution per queue) and a stacked area over time (GPUs in use per tenant).

Nothing is fetched and nothing runs in the browser: the console's Content-Security-Policy allows no script and no
stylesheet from elsewhere, and these need neither. Every figure is also written as text (cell labels, bar counts,
a <title> per mark), so a chart reads without colour and with the page's own search. Pure: numbers and labels
in, one `<svg>` string out; all text is escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

INK, MUTED, LINE = "#1d232b", "#5b6573", "#d5dbe3"
FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif"
CHAR_W = 7.2  # px per character of 12 px text, a little wide: sizes label columns so labels never overlap marks
# Tenants' colours (Okabe–Ito: told apart with the common colour-vision deficiencies), in order.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#999999", "#f0e442")
# The heat map's scale: no use → the whole quota in blues; past the quota (borrowed GPUs) orange to red at 2×.
_EMPTY, _FULL = (238, 243, 251), (11, 61, 145)
_OVER, _FAR_OVER = (253, 174, 97), (179, 38, 30)


def _e(text: object) -> str:
    return escape(str(text), quote=True)


def _n(x: float) -> str:
    """A coordinate: at most one decimal, no trailing zeros."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    t = min(1.0, max(0.0, t))
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b, strict=True))


def heat_colour(share: float | None) -> str:
    """The fill for a use of `share` of the quota (1.0 = all of it): light to dark blue up to the quota, orange
    to red past it, reaching red at twice the quota."""
    if share is None or not math.isfinite(share) or share <= 0:
        return _mix(_EMPTY, _FULL, 0)
    if share <= 1:
        return _mix(_EMPTY, _FULL, share)
    return _mix(_OVER, _FAR_OVER, share - 1)


def ink_on(fill: str) -> str:
    """Text colour that reads on `fill` (#rrggbb): white on dark fills, the page's ink on light ones."""
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return "#ffffff" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 140 else INK


def percent(share: float) -> str:
    """`0%`, `<1%`, `57%`, `130%`."""
    if not math.isfinite(share) or share <= 0:
        return "0%"
    return "<1%" if share < 0.005 else f"{round(share * 100)}%"


def nice_ticks(top: float, most: int = 5) -> list[float]:
    """Round axis values from 0 to at least `top` (steps of 1, 2, 2.5 or 5 × 10^k), at most `most` + 1 of them."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if v % 1 else str(int(v))


def _text(x: float, y: float, text: object, *, size: int = 12, anchor: str = "start", fill: str = INK,
          weight: str = "normal") -> str:
    return (f'<text x="{_n(x)}" y="{_n(y)}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"'
            f' font-weight="{weight}">{_e(text)}</text>')


def _svg(width: float, height: float, kind: str, title: str, body: list[str]) -> str:
    # width/height give the intrinsic size; the page's CSS lets it shrink to its card (max-width: 100%).
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart chart-{kind}" viewBox="0 0 {_n(width)} {_n(height)}"'
            f' width="{_n(width)}" height="{_n(height)}" role="img" aria-label="{_e(title)}"'
            f' font-family="{_e(FONT)}"><title>{_e(title)}</title>{"".join(body)}</svg>')


# -- heat map --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeatRow:
    """One tenant: its label, a note under it (what it is measured against) and its share of quota per column."""

    label: str
    note: str
    shares: Sequence[float]
    titles: Sequence[str] = ()  # a tooltip per cell (e.g. the GPU-hours behind it)


def heatmap(rows: Sequence[HeatRow], columns: Sequence[str], *, title: str, cell_w: float = 62,
            cell_h: float = 34) -> str:
    """A grid of rows × columns, each cell filled by heat_colour and labelled with its percentage, with the
    column labels above and a legend of the scale below. Raises ValueError if a row has not one share per column."""
    for r in rows:
        if len(r.shares) != len(columns) or (r.titles and len(r.titles) != len(columns)):
            raise ValueError(f"row {r.label!r} has {len(r.shares)} values for {len(columns)} columns")
    left = max([CHAR_W * len(r.label) for r in rows] + [CHAR_W * 0.85 * len(r.note) for r in rows] + [60]) + 14
    top = 24
    width = max(left + cell_w * len(columns), 430) + 2
    height = top + cell_h * max(1, len(rows)) + 46
    body = [_text(left + cell_w * (i + 0.5), top - 8, c, anchor="middle", fill=MUTED) for i, c in enumerate(columns)]
    if not rows:
        body.append(_text(left, top + cell_h / 2 + 4, "No tenants yet.", fill=MUTED))
    for j, r in enumerate(rows):
        y = top + cell_h * j
        body.append(_text(0, y + cell_h / 2 - 1, r.label, weight="600"))
        body.append(_text(0, y + cell_h / 2 + 12, r.note, size=10, fill=MUTED))
        for i, share in enumerate(r.shares):
            fill = heat_colour(share)
            tip = r.titles[i] if r.titles else f"{r.label}, {columns[i]}: {percent(share)}"
            body.append(f'<g class="cell" data-share="{share:.4f}"><title>{_e(tip)}</title>'
                        f'<rect x="{_n(left + cell_w * i + 1)}" y="{_n(y + 1)}" width="{_n(cell_w - 2)}"'
                        f' height="{_n(cell_h - 2)}" rx="3" fill="{fill}"/>'
                        + _text(left + cell_w * (i + 0.5), y + cell_h / 2 + 4, percent(share), anchor="middle",
                                fill=ink_on(fill)) + "</g>")
    legend_y = top + cell_h * max(1, len(rows)) + 16
    body.append(_text(left, legend_y + 11, "of quota:", size=11, anchor="end", fill=MUTED))
    for k, (share, name) in enumerate(((0, "0%"), (0.25, "25%"), (0.5, "50%"), (0.75, "75%"), (1.0, "100%"),
                                       (1.5, "more: borrowed"))):
        x = left + 6 + k * 56
        body.append(f'<rect x="{_n(x)}" y="{_n(legend_y)}" width="16" height="14" rx="2" fill="{heat_colour(share)}"'
                    f' stroke="{LINE}"/>')
        body.append(_text(x + 20, legend_y + 11, name, size=11, fill=MUTED))
    return _svg(max(width, left + 6 + 5 * 56 + 110), height, "heatmap", title, body)


# -- bar charts side by side -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bars:
    """One panel: its label, a note under it (e.g. percentiles; a line per "\\n") and a count per bucket."""

    label: str
    note: str
    counts: Sequence[int]


def bar_panels(panels: Sequence[Bars], buckets: Sequence[str], *, title: str, empty: str = "none yet",
               bar_w: float = 30) -> str:
    """Panels side by side on one shared scale (a taller bar is more jobs, whichever panel it is in), each bar
    labelled with its count. Raises ValueError if a panel has not one count per bucket."""
    for p in panels:
        if len(p.counts) != len(buckets):
            raise ValueError(f"panel {p.label!r} has {len(p.counts)} counts for {len(buckets)} buckets")
    slot = bar_w + 10
    notes = [p.note.split("\n") if p.note else [] for p in panels]
    widest = max([len(line) for lines in notes for line in lines] + [0])
    panel_w = max(slot * len(buckets) + 16, CHAR_W * 0.85 * widest + 8)
    # The title, its note lines, and room above the tallest bar for its count.
    plot_h, head, foot = 110.0, 36.0 + 13 * max([len(lines) for lines in notes] + [1]), 22.0
    top = max([c for p in panels for c in p.counts] + [1])
    body: list[str] = []
    for k, p in enumerate(panels):
        x0 = k * (panel_w + 18)
        body.append(_text(x0, 14, p.label, weight="600"))
        body.extend(_text(x0, 29 + 13 * i, line, size=10, fill=MUTED) for i, line in enumerate(notes[k]))
        base = head + plot_h
        body.append(f'<line x1="{_n(x0)}" y1="{_n(base)}" x2="{_n(x0 + slot * len(buckets))}" y2="{_n(base)}"'
                    f' stroke="{LINE}"/>')
        for i, (bucket, count) in enumerate(zip(buckets, p.counts, strict=True)):
            x = x0 + slot * i + 5
            h = plot_h * count / top
            body.append(f'<g class="bar" data-count="{count}"><title>{_e(f"{p.label}, {bucket}: {count}")}</title>'
                        f'<rect x="{_n(x)}" y="{_n(base - h)}" width="{_n(bar_w)}" height="{_n(h)}" rx="2"'
                        f' fill="{PALETTE[0]}"/></g>')
            if count:
                body.append(_text(x + bar_w / 2, base - h - 4, count, size=11, anchor="middle"))
            body.append(_text(x + bar_w / 2, base + 15, bucket, size=10, anchor="middle", fill=MUTED))
        if not any(p.counts):
            body.append(_text(x0 + slot * len(buckets) / 2, head + plot_h / 2, empty, size=11, anchor="middle",
                              fill=MUTED))
    width = max(1, len(panels)) * (panel_w + 18)
    return _svg(width, head + plot_h + foot, "bars", title, body)


# -- stacked area over time ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    """One band of a stacked area: its label and a value per time step."""

    label: str
    values: Sequence[float]


def stacked_area(series: Sequence[Series], steps: Sequence[str], *, title: str, unit: str,
                 capacity: float | None = None, capacity_label: str = "", width: float = 720,
                 height: float = 210) -> str:
    """Values per time step stacked band on band, each step drawn flat across its width (a step is a period,
    such as an hour, and its value that period's average), the y axis in round numbers of `unit`, a dashed line
    at `capacity`, every few steps' label under the axis and a legend. Raises ValueError if a series has not one
    value per step."""
    for s in series:
        if len(s.values) != len(steps):
            raise ValueError(f"series {s.label!r} has {len(s.values)} values for {len(steps)} steps")
    n = max(1, len(steps))
    totals = [sum(max(0.0, s.values[i]) for s in series) for i in range(len(steps))]
    ticks = nice_ticks(max([*totals, capacity or 0.0, 1.0]))
    left, right, top, bottom = 8 + CHAR_W * max(len(_label(t)) for t in ticks), 12.0, 28.0, 26.0
    plot_w, plot_h = width - left - right, height - top - bottom
    step_w = plot_w / n

    def y(v: float) -> float:
        return top + plot_h * (1 - v / ticks[-1])

    body = [_text(left, 14, unit, size=11, fill=MUTED)]
    for t in ticks:
        dashed = "" if t == 0 else ' stroke-dasharray="2 3"'
        body.append(f'<line x1="{_n(left)}" y1="{_n(y(t))}" x2="{_n(left + plot_w)}" y2="{_n(y(t))}" stroke="{LINE}"'
                    f'{dashed}/>')
        body.append(_text(left - 6, y(t) + 4, _label(t), size=11, anchor="end", fill=MUTED))
    below = [0.0] * len(steps)
    for k, s in enumerate(series):
        above = [below[i] + max(0.0, s.values[i]) for i in range(len(steps))]
        edge = [(left + step_w * (i + e), y(above[i])) for i in range(len(steps)) for e in (0, 1)]
        back = [(left + step_w * (i + e), y(below[i])) for i in reversed(range(len(steps))) for e in (1, 0)]
        points = " ".join(f"{_n(px)},{_n(py)}" for px, py in edge + back)
        peak = max(s.values, default=0.0)
        body.append(f'<polygon class="band" data-label="{_e(s.label)}" points="{points}"'
                    f' fill="{PALETTE[k % len(PALETTE)]}" fill-opacity="0.85">'
                    f'<title>{_e(f"{s.label}: up to {_label(round(peak, 1))} {unit}")}</title></polygon>')
        below = above
    if capacity:
        body.append(f'<line class="capacity" x1="{_n(left)}" y1="{_n(y(capacity))}" x2="{_n(left + plot_w)}"'
                    f' y2="{_n(y(capacity))}" stroke="{INK}" stroke-width="1.5" stroke-dasharray="6 4"/>')
        body.append(_text(left + plot_w - 2, y(capacity) - 5, capacity_label, size=11, anchor="end"))
    every = max(1, math.ceil(n / 8))
    for i in range(0, len(steps), every):
        body.append(_text(left + step_w * i, top + plot_h + 16, steps[i], size=10, anchor="middle", fill=MUTED))
    x = left + CHAR_W * (len(unit) + 3)
    for k, s in enumerate(series):
        body.append(f'<rect x="{_n(x)}" y="4" width="12" height="12" rx="2" fill="{PALETTE[k % len(PALETTE)]}"/>')
        body.append(_text(x + 16, 14, s.label, size=11))
        x += 16 + CHAR_W * len(s.label) + 14
    if not series:
        body.append(_text(left + plot_w / 2, top + plot_h / 2, "nothing ran", size=11, anchor="middle", fill=MUTED))
    return _svg(width, height, "area", title, body)
