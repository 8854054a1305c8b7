"""The console's charts: small inline SVG we write ourselves, drawn on the server.

No chart library runs in the browser (the console loads no third-party code, and many deployments
have no network to fetch one from), and drawing a PNG with matplotlib costs tens of milliseconds a
chart; a few dozen SVG elements cost nothing to build and scale with the page. Every piece of text
(option names, reasons, tooltips) is escaped with ``markupsafe``, so a task or option named
``<script>`` is drawn as text. Colours and fonts come from ``console.css`` through class names, so
the pages need no inline style (the console's Content-Security-Policy allows none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from markupsafe import Markup, escape

__all__ = [
    "Bar",
    "Mark",
    "Series",
    "activity",
    "columns",
    "coverage",
    "distribution",
    "escalations",
    "hbars",
    "percent",
    "plain",
    "reliability",
    "xy",
]

Format = Callable[[float], str]

_W, _H = 640.0, 220.0
_LEFT, _RIGHT, _TOP, _BOTTOM = 48.0, 12.0, 10.0, 30.0


def plain(value: float) -> str:
    """A count or amount, short: 950, 12.5k, 3.2M."""
    magnitude = abs(value)
    if magnitude >= 1e6:
        return f"{value / 1e6:.3g}M"
    if magnitude >= 1e3:
        return f"{value / 1e3:.3g}k"
    return f"{value:.3g}"


def percent(value: float) -> str:
    return f"{100 * value:.0f}%"


@dataclass(frozen=True, slots=True)
class Bar:
    """One bar: its axis label (may be empty), its value, and the tooltip a pointer shows."""

    label: str
    value: float
    title: str
    css: str = ""
    """An extra class (``chosen``: the option the decision took)."""


@dataclass(frozen=True, slots=True)
class Mark:
    """A vertical rule across a chart at ``value``, labelled (a threshold, a band edge)."""

    value: float
    label: str
    css: str = ""


@dataclass(frozen=True, slots=True)
class Series:
    """A line through ``points`` (x, y); a ``None`` y breaks the line (no data there)."""

    points: Sequence[tuple[float, float | None]]
    label: str
    css: str = ""
    dots: bool = True
    titles: Sequence[str] = field(default_factory=tuple)
    """A tooltip per point, when given."""


def _n(value: float) -> str:
    return f"{value:.1f}"


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (1 when there is nothing)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power * (1 + 1e-9):
            return step * power
    return 10.0 * power


def _svg(body: list[str], label: str, *, height: float = _H, css: str = "chart") -> Markup:
    inner = "".join(body)
    return Markup(
        f'<svg class="{escape(css)}" viewBox="0 0 {_n(_W)} {_n(height)}" role="img" aria-label="{escape(label)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>{inner}</svg>'
    )


def _y_axis(y_max: float, y_format: Format, scale: Callable[[float], float], ticks: int = 4) -> list[str]:
    out = []
    for i in range(ticks + 1):
        value = y_max * i / ticks
        y = scale(value)
        out.append(f'<line class="grid" x1="{_n(_LEFT)}" x2="{_n(_W - _RIGHT)}" y1="{_n(y)}" y2="{_n(y)}"/>')
        out.append(f'<text class="tick" x="{_n(_LEFT - 6)}" y="{_n(y + 4)}" text-anchor="end">')
        out.append(f"{escape(y_format(value))}</text>")
    return out


def columns(bars: Sequence[Bar], *, label: str, y_format: Format = plain) -> Markup:
    """A column chart (a time series: one column per bucket); the columns with a label get a tick."""
    bottom = _H - _BOTTOM
    y_max = _nice_max(max((b.value for b in bars), default=0.0))

    def scale(v: float) -> float:
        return bottom - (bottom - _TOP) * v / y_max

    body = _y_axis(y_max, y_format, scale)
    slot = (_W - _LEFT - _RIGHT) / max(len(bars), 1)
    gap = min(2.0, slot * 0.2)
    for i, bar in enumerate(bars):
        x = _LEFT + i * slot
        y = scale(bar.value)
        css = f"bar {bar.css}".strip()
        body.append(
            f'<rect class="{escape(css)}" x="{_n(x + gap / 2)}" y="{_n(y)}" width="{_n(max(slot - gap, 0.5))}" '
            f'height="{_n(bottom - y)}"><title>{escape(bar.title)}</title></rect>'
        )
        if bar.label:
            body.append(
                f'<text class="tick" x="{_n(x + slot / 2)}" y="{_n(bottom + 16)}" text-anchor="middle">'
                f"{escape(bar.label)}</text>"
            )
    body.append(f'<line class="axis" x1="{_n(_LEFT)}" x2="{_n(_W - _RIGHT)}" y1="{_n(bottom)}" y2="{_n(bottom)}"/>')
    return _svg(body, label)


def hbars(
    bars: Sequence[Bar],
    *,
    label: str,
    x_max: float | None = None,
    x_format: Format = plain,
    marks: Sequence[Mark] = (),
) -> Markup:
    """Horizontal bars, one a row, each with its label on the left and its value on the right.

    ``x_max`` fixes the scale (1 for probabilities); ``marks`` draw rules across every row.
    """
    row, label_w, value_w = 26.0, 170.0, 64.0
    top = 8.0 + (14.0 if marks else 0.0)
    height = top + row * max(len(bars), 1) + 8.0
    span = x_max if x_max is not None else _nice_max(max((b.value for b in bars), default=0.0))
    left, right = label_w, _W - value_w

    def scale(v: float) -> float:
        return left + (right - left) * min(max(v / span, 0.0), 1.0)

    body: list[str] = []
    for i, bar in enumerate(bars):
        y = top + i * row
        css = f"bar {bar.css}".strip()
        text = bar.label if len(bar.label) <= 26 else bar.label[:25] + "\u2026"
        body.append(
            f'<g class="hbar" data-label="{escape(bar.label)}" data-value="{bar.value:.6g}">'
            f'<text class="label" x="{_n(left - 8)}" y="{_n(y + 17)}" text-anchor="end">{escape(text)}</text>'
            f'<rect class="track" x="{_n(left)}" y="{_n(y + 5)}" width="{_n(right - left)}" height="{_n(row - 10)}"/>'
            f'<rect class="{escape(css)}" x="{_n(left)}" y="{_n(y + 5)}" width="{_n(max(scale(bar.value) - left, 0))}"'
            f' height="{_n(row - 10)}"><title>{escape(bar.title)}</title></rect>'
            f'<text class="value" x="{_n(right + 8)}" y="{_n(y + 17)}">{escape(x_format(bar.value))}</text></g>'
        )
    for mark in marks:
        x = scale(mark.value)
        css = f"mark {mark.css}".strip()
        body.append(
            f'<g class="{escape(css)}"><line x1="{_n(x)}" x2="{_n(x)}" y1="{_n(top - 2)}" y2="{_n(height - 6)}"/>'
            f'<text x="{_n(x)}" y="{_n(top - 6)}" text-anchor="middle">{escape(mark.label)}</text></g>'
        )
    return _svg(body, label, height=height, css="chart hchart")


def xy(
    series: Sequence[Series],
    *,
    label: str,
    x_range: tuple[float, float] = (0.0, 1.0),
    y_range: tuple[float, float] = (0.0, 1.0),
    x_format: Format = percent,
    y_format: Format = percent,
    x_ticks: Sequence[float] = (),
    x_labels: Sequence[str] = (),
    diagonal: bool = False,
    bands: Sequence[tuple[float, float, float, str]] = (),
) -> Markup:
    """Lines on a plane (``x_range`` by ``y_range``): the kept share over time, the coverage curve.

    ``diagonal`` draws y = x (a reliability diagram's perfect calibration); ``bands`` are columns
    ``(x_from, x_to, y, title)`` under the lines (a reliability diagram's bins).
    """
    bottom, left, right = _H - _BOTTOM, _LEFT, _W - _RIGHT
    (x0, x1), (y0, y1) = x_range, y_range
    x_span, y_span = (x1 - x0) or 1.0, (y1 - y0) or 1.0

    def sx(v: float) -> float:
        return left + (right - left) * (v - x0) / x_span

    def sy(v: float) -> float:
        return bottom - (bottom - _TOP) * (v - y0) / y_span

    body: list[str] = []
    for i in range(5):
        value = y0 + y_span * i / 4
        grid_y = sy(value)
        body.append(f'<line class="grid" x1="{_n(left)}" x2="{_n(right)}" y1="{_n(grid_y)}" y2="{_n(grid_y)}"/>')
        body.append(f'<text class="tick" x="{_n(left - 6)}" y="{_n(grid_y + 4)}" text-anchor="end">')
        body.append(f"{escape(y_format(value))}</text>")
    ticks = list(x_ticks) or [x0 + x_span * i / 4 for i in range(5)]
    names = list(x_labels) or [x_format(t) for t in ticks]
    for tick, name in zip(ticks, names, strict=False):
        x = sx(tick)
        anchor = "end" if x > right - 16 else "middle"  # the last label stays inside the chart
        body.append(
            f'<text class="tick" x="{_n(x)}" y="{_n(bottom + 16)}" text-anchor="{anchor}">{escape(name)}</text>'
        )
    for x_from, x_to, height, title in bands:
        top, width = sy(height), max(sx(x_to) - sx(x_from) - 2, 0.5)
        body.append(
            f'<rect class="band" x="{_n(sx(x_from) + 1)}" y="{_n(top)}" width="{_n(width)}"'
            f' height="{_n(bottom - top)}"><title>{escape(title)}</title></rect>'
        )
    if diagonal:
        body.append(f'<line class="diagonal" x1="{_n(sx(x0))}" y1="{_n(sy(y0))}" x2="{_n(sx(x1))}" y2="{_n(sy(y1))}"/>')
    for s in series:
        css = f"line {s.css}".strip()
        runs: list[list[tuple[float, float]]] = [[]]
        for x, y in s.points:
            if y is None:
                runs.append([])
            else:
                runs[-1].append((sx(x), sy(y)))
        for run in runs:
            if len(run) > 1:
                path = " ".join(f"{_n(px)},{_n(py)}" for px, py in run)
                body.append(f'<polyline class="{escape(css)}" points="{path}"/>')
        if s.dots:
            for i, (x, y) in enumerate(s.points):
                if y is None:
                    continue
                title = s.titles[i] if i < len(s.titles) else f"{x_format(x)}: {y_format(y)}"
                body.append(
                    f'<circle class="dot {escape(s.css)}" cx="{_n(sx(x))}" cy="{_n(sy(y))}" r="2.5">'
                    f"<title>{escape(title)}</title></circle>"
                )
    body.append(f'<line class="axis" x1="{_n(left)}" x2="{_n(right)}" y1="{_n(bottom)}" y2="{_n(bottom)}"/>')
    return _svg(body, label)


# -- the pages' charts, from plain values ---------------------------------------------------------------


def _moment(start: datetime, hours: int) -> str:
    return start.strftime("%a %d %b %H:00") + (f" +{hours} h" if hours > 1 else "")


def _ticks(starts: Sequence[datetime], hours: int) -> tuple[list[bool], str]:
    """Which buckets carry an axis label, and its format: every 3 h over a day, days over a week, every 5 days."""
    span_h = len(starts) * hours
    if span_h <= 48:
        return [s.hour % 3 == 0 for s in starts], "%H:00"
    if span_h <= 24 * 10:
        return [s.hour == 0 for s in starts], "%a %d"
    return [s.hour == 0 and s.day % 5 == 1 for s in starts], "%d %b"


def activity(
    starts: Sequence[datetime], decided: Sequence[int], kept: Sequence[int], *, hours: int, now: datetime
) -> tuple[Markup, Markup]:
    """The overview's two time series: decisions per hour, and the share System 1 kept, per bucket of ``hours``.

    A bucket still running at ``now`` is drawn lighter: its rate is of the hours so far.
    """
    ticked, fmt = _ticks(starts, hours)
    bars = []
    for start, n, tick in zip(starts, decided, ticked, strict=True):
        running = start + timedelta(hours=hours) > now
        so_far = max((now - start).total_seconds() / 3600, 1 / 60) if running else float(hours)
        bars.append(
            Bar(
                label=start.strftime(fmt) if tick else "",
                value=n / so_far,
                title=f"{_moment(start, hours)} UTC: {n:,} decisions ({n / so_far:,.1f} an hour)"
                + (", so far" if running else ""),
                css="partial" if running else "",
            )
        )
    rate = columns(bars, label="Decisions per hour")
    points = [(i + 0.5, k / n if n else None) for i, (n, k) in enumerate(zip(decided, kept, strict=True))]
    titles = [
        f"{_moment(start, hours)} UTC: kept {k:,} of {n:,}" + (f" ({k / n:.1%})" if n else "")
        for start, n, k in zip(starts, decided, kept, strict=True)
    ]
    ticks = [i + 0.5 for i, tick in enumerate(ticked) if tick]
    share = xy(
        [Series(points, "kept share", css="kept", titles=titles)],
        label="Share of decisions System 1 kept",
        x_range=(0.0, float(len(starts))),
        x_ticks=ticks,
        x_labels=[starts[int(t)].strftime(fmt) for t in ticks],
    )
    return rate, share


def escalations(by_reason: Mapping[str, int]) -> Markup:
    """Decisions System 1 did not keep, one bar a reason, most first."""
    total = sum(by_reason.values()) or 1
    bars = [Bar(reason, n, f"{reason}: {n:,} ({n / total:.1%})") for reason, n in by_reason.items()]
    return hbars(bars, label="Escalations by reason", x_format=lambda v: f"{v:,.0f}")


def distribution(probabilities: Mapping[str, float], *, chosen: str | None, marks: Sequence[Mark] = ()) -> Markup:
    """A decision's distribution, most probable first; ``chosen`` (the decision's outcome) stands out."""
    ordered = sorted(probabilities.items(), key=lambda item: (-item[1], item[0]))
    bars = [Bar(option, p, f"P({option}) = {p:.4f}", css="chosen" if option == chosen else "") for option, p in ordered]
    return hbars(bars, label="The calibrated distribution", x_max=1.0, x_format=lambda v: f"{v:.3f}", marks=marks)


def reliability(bins: Sequence[tuple[float, float, int, float | None, float | None]]) -> Markup:
    """A reliability diagram: per confidence bin ``(lower, upper, rows, confidence, accuracy)``, against y = x."""
    filled = [b for b in bins if b[4] is not None and b[3] is not None]
    bands = [
        (lower, upper, float(acc or 0.0), f"{lower:.0%}-{upper:.0%}: {rows:,} decisions, accuracy {acc:.1%}")
        for lower, upper, rows, _conf, acc in filled
    ]
    points = [(float(conf or 0.0), acc) for _lower, _upper, _rows, conf, acc in filled]
    titles = [f"mean confidence {conf:.1%}, accuracy {acc:.1%} ({rows:,})" for _l, _u, rows, conf, acc in filled]
    return xy(
        [Series(points, "accuracy", css="reliability", titles=titles)],
        label="Reliability: accuracy against confidence",
        diagonal=True,
        bands=bands,
    )


def coverage(points: Sequence[tuple[float, float, float]]) -> Markup:
    """The accuracy-coverage curve: ``(coverage, accuracy, threshold)``, keeping the most confident first."""
    low = min((a for _c, a, _t in points), default=0.0)
    y0 = max(0.0, math.floor(low * 10) / 10 - 0.1) if points else 0.0
    titles = [f"threshold {t:.3f}: keeps {c:.1%} at {a:.1%} accuracy" for c, a, t in points]
    return xy(
        [Series([(c, a) for c, a, _t in points], "accuracy", css="coverage", titles=titles, dots=len(points) <= 40)],
        label="Accuracy against coverage",
        y_range=(y0, 1.0),
    )
