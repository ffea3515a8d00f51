"""The report's charts, matplotlib SVGs inlined as base64: over-delivery and debt per minute of
a dispatch scope, and a subscription's acknowledged ranges against the unacked-range cap."""

from __future__ import annotations

import base64
import io
from datetime import date, datetime, timedelta, timezone

from .blocks import Chart


def _figure(height: float = 2.6):
    import matplotlib
    from matplotlib.figure import Figure

    # The same values every time, so sections drawing in threads at once write no different ones.
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text stays text: small files, crisp in any browser
            "svg.hashsalt": "brokerlens",  # same data, same file
            "font.family": "sans-serif",
            "font.size": 9,
            "axes.spines.top": False,
            "axes.titlesize": 10,
            "axes.titleweight": "bold",
            "axes.titlelocation": "left",
        }
    )
    # A Figure of its own, not pyplot's: pyplot keeps every open figure in one global registry,
    # which the report's sections, drawn in threads at once, must not share.
    fig = Figure(figsize=(11, height), layout="constrained")
    return fig, fig.subplots()


def _svg(fig) -> str:
    # Ids for the chart's parts, so that a test (or a reader's tool) finds its axis labels and
    # legend in the SVG: x-label, y-label-N, legend-N (and "title", set with the title).
    fig.axes[0].xaxis.label.set_gid("x-label")
    for i, ax in enumerate(fig.axes):
        ax.yaxis.label.set_gid(f"y-label-{i}")
    for i, legend in enumerate(fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]):
        legend.set_gid(f"legend-{i}")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _time_axis(ax, start: datetime, end: datetime) -> None:
    import matplotlib.dates as mdates
    from matplotlib.ticker import StrMethodFormatter

    ax.set_xlim(start, end)
    if (end - start) <= timedelta(days=1):
        ax.xaxis.set_major_locator(mdates.HourLocator(interval=2, tz=timezone.utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=timezone.utc))
        ax.set_xlabel("UTC")
    else:
        ax.xaxis.set_major_locator(mdates.DayLocator(tz=timezone.utc))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%d %b", tz=timezone.utc))
        ax.xaxis.set_minor_locator(mdates.HourLocator(byhour=[6, 12, 18], tz=timezone.utc))
        ax.grid(axis="x", which="major", alpha=0.3)
        ax.set_xlabel("UTC (days from 00:00)")
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    ax.grid(axis="y", alpha=0.3)


def dispatch_chart(day: date, label: str, unit: str, minutes: dict[int, tuple[int, int]]) -> Chart:
    """Over-delivery per minute (area) and the debt carried out (line) of one scope."""
    import numpy as np

    start = datetime(day.year, day.month, day.day, tzinfo=timezone.utc)
    from matplotlib.ticker import StrMethodFormatter

    times = [start + timedelta(minutes=m) for m in range(1440)]
    over = np.zeros(1440)
    # Debt drains through minutes without a record; the line is broken there, not interpolated.
    debt = np.full(1440, np.nan)
    for m, (o, d) in minutes.items():
        over[m], debt[m] = o, d
    fig, ax = _figure()
    busy = np.nonzero(over)[0]
    # One vertical stroke per minute over quota: visible even for a single minute in a day.
    ax.vlines([times[m] for m in busy], 0, over[busy], color="#d6604d", linewidth=1.6, label=f"over quota ({unit} per minute)")
    ax.set_ylabel(f"over quota, {unit}/min")
    ax.set_ylim(0, max(1, over.max()) * 1.1)
    ax2 = ax.twinx()
    # Markers keep isolated minutes visible; a busy day reads as a line without them.
    ax2.plot(
        times,
        debt,
        color="#2166ac",
        linewidth=1.1,
        marker="o" if len(minutes) < 120 else None,
        markersize=2,
        label=f"debt carried out ({unit}, max per minute)",
    )
    ax2.set_ylabel(f"debt, {unit}")
    ax2.set_ylim(0, max(1, np.nanmax(debt) if len(minutes) else 1) * 1.1)
    ax2.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    _time_axis(ax, start, start + timedelta(days=1))
    ax.set_title(label, gid="title")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    fig.legend(handles=handles, loc="outside upper right", ncols=2, frameon=False, fontsize=8)
    total_over = int(over.sum())
    peak_debt = max((d for _, d in minutes.values()), default=0)
    return Chart(
        label,
        _svg(fig),
        f"{label}: {total_over:,} {unit} over quota in the day, debt up to {peak_debt:,} {unit}",
    )


def cursor_chart(
    label: str,
    points: list[tuple[int, int]],
    cap: int,
    warning: int,
    last: tuple[int, int] | None,
    growth_per_hour: float | None,
    forecast_at: int | None,
    window: tuple[datetime, datetime],
) -> Chart:
    """Ranges over the last days against the cap and the warning threshold, with the forecast."""
    points = sorted(points)
    times = [datetime.fromtimestamp(t, tz=timezone.utc) for t, _ in points]
    start, end = window
    fig, ax = _figure(2.8)
    ax.plot(times, [r for _, r in points], color="#2166ac", linewidth=1.3, label="ranges (max per 10 min)")
    ax.axhline(cap, color="#b2182b", linewidth=1.2, label=f"cap {cap:,}")
    ax.axhline(warning, color="#ef8a62", linewidth=1, linestyle="--", label=f"warning {warning:,}")
    if last is not None and growth_per_hour and growth_per_hour > 0:
        t0 = datetime.fromtimestamp(last[0], tz=timezone.utc)
        reach = datetime.fromtimestamp(forecast_at, tz=timezone.utc) if forecast_at else end
        t1 = min(reach, end)
        r1 = last[1] + growth_per_hour * (t1 - t0).total_seconds() / 3600
        ax.plot([t0, t1], [last[1], r1], color="#2166ac", linestyle=":", linewidth=1.3, label=f"trend {growth_per_hour:+,.0f}/h")
        if forecast_at and last[1] < cap and reach <= end:
            ax.plot([reach], [cap], marker="o", color="#b2182b")
            ax.annotate(f"cap at {reach:%d %b %H:%M} UTC", (reach, cap), textcoords="offset points", xytext=(-4, 6), ha="right", fontsize=8, color="#b2182b")
    top = max([cap, *(r for _, r in points)]) * 1.12
    ax.set_ylim(0, top)
    ax.set_ylabel("ranges")
    _time_axis(ax, start, end)
    ax.set_title(label, gid="title")
    fig.legend(loc="outside upper right", frameon=False, fontsize=8, ncols=4)
    peak = max((r for _, r in points), default=0)
    return Chart(label, _svg(fig), f"{label}: up to {peak:,} ranges against a cap of {cap:,}")
