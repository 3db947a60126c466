"""gateway/console/charts.py on its own: numbers in, well-formed SVG out, with marks where the numbers say."""

from __future__ import annotations

import itertools
import re
import xml.etree.ElementTree as ET

import pytest

from gateway.console import charts

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # well-formed XML, or this raises
    assert root.tag == SVG + "svg" and root.get("role") == "img" and root.find(SVG + "title") is not None
    assert "<script" not in svg and "href" not in svg  # draws only; nothing to fetch or run
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(SVG + "text")]


def luminance(colour: str) -> float:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize(("share", "said"), [(0, "0%"), (0.004, "<1%"), (0.567, "57%"), (1.3, "130%"),
                                             (float("nan"), "0%")], ids=repr)
def test_percent(share: float, said: str) -> None:
    assert charts.percent(share) == said


def test_heat_colour_darkens_with_use_and_turns_orange_past_the_quota() -> None:
    shades = [charts.heat_colour(u / 10) for u in range(11)]
    assert all(luminance(a) > luminance(b) for a, b in itertools.pairwise(shades))
    over = charts.heat_colour(1.4)
    r, g, b = (int(over[i:i + 2], 16) for i in (1, 3, 5))
    assert r > g > b  # orange to red, not another blue
    empty = charts.heat_colour(0)
    assert charts.heat_colour(None) == charts.heat_colour(-1) == charts.heat_colour(float("nan")) == empty
    assert charts.heat_colour(5) == charts.heat_colour(2)  # red at twice the quota, and no further
    assert charts.ink_on(charts.heat_colour(1)) == "#ffffff" and charts.ink_on(charts.heat_colour(0)) == charts.INK


@pytest.mark.parametrize(("top", "ticks"), [
    (16, [0, 5, 10, 15, 20]), (7, [0, 2, 4, 6, 8]), (1, [0, 0.2, 0.4, 0.6, 0.8, 1]), (123, [0, 25, 50, 75, 100, 125]),
    (0, [0, 1]), (float("inf"), [0, 1]),
], ids=repr)
def test_axis_ticks_are_round_numbers(top: float, ticks: list[float]) -> None:
    assert charts.nice_ticks(top) == pytest.approx(ticks)


def test_heatmap_draws_a_labelled_cell_per_tenant_and_day() -> None:
    rows = [charts.HeatRow("vision", "quota 4 GPUs", [0.0, 0.5, 1.25], ["a", "b", "c"]),
            charts.HeatRow("<speech & co>", "no quota", [0.004, 0.0, 0.9])]
    root = parse(charts.heatmap(rows, ["Mon 1", "Tue 2", "Wed 3"], title="Quota use"))
    cells = [g for g in root.iter(SVG + "g") if g.get("class") == "cell"]
    assert len(cells) == 6
    fills = [c.find(SVG + "rect").get("fill") for c in cells]  # type: ignore[union-attr]
    assert fills == [charts.heat_colour(s) for s in (0.0, 0.5, 1.25, 0.004, 0.0, 0.9)]
    assert [c.find(SVG + "text").text for c in cells] == ["0%", "50%", "125%", "<1%", "0%", "90%"]  # type: ignore[union-attr]
    assert [c.find(SVG + "title").text for c in cells][:3] == ["a", "b", "c"]  # type: ignore[union-attr]
    words = texts(root)
    assert "<speech & co>" in words and "vision" in words and {"Mon 1", "Tue 2", "Wed 3"} <= set(words)
    assert "more: borrowed" in words  # the legend says what orange means
    with pytest.raises(ValueError, match="2 values for 3 columns"):
        charts.heatmap([charts.HeatRow("x", "", [0.1, 0.2])], ["a", "b", "c"], title="t")
    assert "No tenants yet." in texts(parse(charts.heatmap([], ["a"], title="t")))


def _height(g: ET.Element) -> float:
    return float(g.find(SVG + "rect").get("height"))  # type: ignore[union-attr,arg-type]


def test_bar_panels_share_one_scale_and_label_every_count() -> None:
    panels = [charts.Bars("normal", "4 started", [1, 3, 0]), charts.Bars("urgent", "", [0, 0, 0]),
              charts.Bars("batch", "6 started", [6, 0, 0])]
    root = parse(charts.bar_panels(panels, ["≤1m", "≤1h", ">1h"], title="Waits", empty="no job started yet"))
    bars = [g for g in root.iter(SVG + "g") if g.get("class") == "bar"]
    assert [int(g.get("data-count", "")) for g in bars] == [1, 3, 0, 0, 0, 0, 6, 0, 0]
    heights = [_height(g) for g in bars]
    assert heights[6] == max(heights) and heights[1] == pytest.approx(heights[6] / 2) and heights[2] == 0
    words = texts(root)
    assert {"normal", "urgent", "batch", "1", "3", "6"} <= set(words) and words.count("no job started yet") == 1
    assert "0" not in words  # an empty bucket is no bar and no label
    with pytest.raises(ValueError, match="2 counts for 3 buckets"):
        charts.bar_panels([charts.Bars("q", "", [1, 2])], ["a", "b", "c"], title="t")


def _points(polygon: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in (p.split(",") for p in (polygon.get("points") or "").split())]


def test_stacked_area_stacks_bands_under_the_capacity_line() -> None:
    series = [charts.Series("vision", [4, 4, 2, -1]), charts.Series("speech", [0, 8, 8, 8])]
    svg = charts.stacked_area(series, ["10:00", "11:00", "12:00", "13:00"], title="Use", unit="GPUs in use",
                              capacity=16, capacity_label="all 16 GPUs", width=500, height=200)
    root = parse(svg)
    bands = [p for p in root.iter(SVG + "polygon") if p.get("class") == "band"]
    assert [b.get("data-label") for b in bands] == ["vision", "speech"]
    (capacity,) = [line for line in root.iter(SVG + "line") if line.get("class") == "capacity"]
    zero = max(y for _, y in _points(bands[0]))  # the axis: the lowest band's bottom edge
    per_gpu = (zero - float(capacity.get("y1", ""))) / 16
    # The top edge of the upper band, step by step: vision + speech, a negative value counted as none.
    top = [y for _, y in _points(bands[1])][:8:2]
    assert [round((zero - y) / per_gpu, 6) for y in top] == [4, 12, 10, 8]
    words = texts(root)
    assert {"vision", "speech", "all 16 GPUs", "10:00", "0", "20"} <= set(words)
    with pytest.raises(ValueError, match="1 values for 2 steps"):
        charts.stacked_area([charts.Series("x", [1])], ["a", "b"], title="t", unit="u")
    assert "nothing ran" in texts(parse(charts.stacked_area([], ["a"], title="t", unit="u")))


def test_every_label_is_escaped() -> None:
    evil = '"><script>alert(1)</script>'
    for svg in (charts.heatmap([charts.HeatRow(evil, evil, [0.5], [evil])], [evil], title=evil),
                charts.bar_panels([charts.Bars(evil, evil, [1])], [evil], title=evil),
                charts.stacked_area([charts.Series(evil, [1])], [evil], title=evil, unit=evil, capacity=2,
                                    capacity_label=evil)):
        root = parse(svg)
        assert evil in texts(root) and not re.search(r"<script", svg)
