"""The PNG figures of an incident report (matplotlib, headless).

Heatmaps record where their plotting area lies in the PNG and which rank each
row is (:class:`HeatmapGeometry`), so a reader, or a test, can find the rows
of the culprits in the picture.
"""

from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dashboards.report_data import (
    MAX_HARDWARE_GPUS,
    HardwareView,
    IncidentWindow,
    hardware_levels,
    hardware_shares,
)
from rankscope.incident import EventVerdict, Incident
from rankscope.topology import format_ranks

DPI = 100
VERDICT_COLOURS = {"contradicted": "#d62728", "supported": "#2ca02c", "unrelated": "#7f7f7f"}
#: The hardware figure's bars: the culprit GPU before and after the onset, the peer GPUs.
PHASE_COLOURS = (("before", "#9ecae1"), ("after", "#d62728"), ("peers", "#8c8c8c"))


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("rankscope report draws its figures with matplotlib: "
                           "pip install 'rankscope[report]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class HeatmapGeometry:
    """Where a heatmap's cells are in its PNG (pixels, origin top-left) and what its rows are."""

    file: str
    left: int
    top: int
    right: int
    bottom: int
    rows: list[int]
    columns: list[int]
    stage: str

    def to_json(self) -> dict:
        return asdict(self)


def timeline(window: IncidentWindow, incident: Incident, path: Path) -> Path:
    """Median and max iteration time over ranks per iteration, with the change point."""
    plt = _pyplot()
    it = window.cube.iterations
    ms = window.cube.iteration_ms
    with np.errstate(all="ignore"):
        med, top = np.nanmedian(ms, axis=1) / 1000, np.nanmax(ms, axis=1) / 1000
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=DPI)
    ax.plot(it, med, lw=2.5, color="#1f77b4", label="median over ranks")
    ax.plot(it, top, lw=1.2, color="#ff7f0e", label="slowest rank")
    ax.axvline(incident.onset_iteration, color="#d62728", lw=2, ls="--",
               label=f"change point (iteration {incident.onset_iteration})")
    if incident.resolved_iteration >= 0:
        ax.axvline(incident.resolved_iteration, color="#2ca02c", lw=2, ls="--",
                   label=f"resolved (iteration {incident.resolved_iteration})")
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration time (s)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    ax.set_title(f"Job {incident.job}: iteration time")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def rank_heatmap(window: IncidentWindow, stage: str, rows: np.ndarray, path: Path, title: str,
                 marks: dict[int, str] | None = None, separators: list[int] | None = None,
                 onset_iteration: int | None = None) -> HeatmapGeometry:
    """``stage`` of ``rows`` (ranks, top to bottom) over iterations, colour = latency (bright = slow)."""
    plt = _pyplot()
    values = window.cube.stage(stage)[:, rows].T  # [row, iteration]
    finite = values[np.isfinite(values)]
    vmin, vmax = (np.percentile(finite, [1, 99.5]) if finite.size else (0.0, 1.0))
    height = min(9.0, 2.2 + len(rows) * 0.035)
    fig, ax = plt.subplots(figsize=(10, height), dpi=DPI)
    it = window.cube.iterations
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="inferno", vmin=vmin, vmax=vmax,
                      extent=(it[0] - 0.5, it[-1] + 0.5, len(rows) - 0.5, -0.5))
    ticks = np.linspace(0, len(rows) - 1, min(len(rows), 12)).round().astype(int)
    ax.set_yticks(ticks, [str(rows[t]) for t in ticks], fontsize=8)
    for y, label in (marks or {}).items():
        ax.annotate(label, xy=(1.0, y), xycoords=("axes fraction", "data"), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8, color="#d62728")
    for y in separators or []:
        ax.axhline(y - 0.5, color="white", lw=0.4, alpha=0.6)
    if onset_iteration is not None:
        ax.axvline(onset_iteration - 0.5, color="#00e0ff", lw=1, ls=":")
    ax.set_xlabel("iteration")
    ax.set_ylabel("rank")
    ax.set_title(title, fontsize=11)
    fig.colorbar(image, ax=ax, label=f"{stage} (ms)", pad=0.12 if marks else 0.02)
    fig.tight_layout()
    fig.canvas.draw()
    box = ax.get_window_extent()
    width_px, height_px = fig.canvas.get_width_height()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return HeatmapGeometry(file=path.name, left=int(np.ceil(box.x0)), right=int(np.floor(box.x1)),
                           top=int(np.ceil(height_px - box.y1)), bottom=int(np.floor(height_px - box.y0)),
                           rows=[int(r) for r in rows], columns=[int(i) for i in it], stage=stage)


def stage_bars(comparison: pd.DataFrame, incident: Incident, path: Path) -> Path:
    """Culprits' median per stage against their group-mates' (log scale), ratio written above."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.8), dpi=DPI)
    x = np.arange(len(comparison))
    ax.bar(x - 0.2, comparison["group_ms"], 0.4, label="group-mates (median)", color="#8c8c8c")
    bars = ax.bar(x + 0.2, comparison["culprit_ms"], 0.4, label=f"culprits {_short(incident)}", color="#d62728")
    for b, r, s in zip(bars, comparison["ratio"], comparison["stage"], strict=True):
        if np.isfinite(r):
            weight = "bold" if s == incident.stage else "normal"
            ax.annotate(f"x{r:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center",
                        va="bottom", fontsize=8, fontweight=weight)
    ax.set_xticks(x, comparison["stage"], rotation=20)
    ax.set_yscale("log")
    ax.set_ylabel("ms after onset (median)")
    ax.set_title(f"Culprits' stages against their {incident.group_type or 'group'} group")
    ax.legend(fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def verdicts(incident: Incident, path: Path) -> Path:
    """One line per out-of-band event: its name and node, the verdict (coloured), the reason."""
    plt = _pyplot()
    events = incident.events or [EventVerdict("no out-of-band events", -1, "", "")]
    lines = [textwrap.wrap(e.reason, 70) or [""] for e in events]
    height = 0.9 + 0.42 * sum(len(x) + 1 for x in lines)
    fig, ax = plt.subplots(figsize=(10, height), dpi=DPI)
    ax.axis("off")
    y = 1.0
    step = 1.0 / (sum(len(x) + 1 for x in lines) + 1)
    for e, wrapped in zip(events, lines, strict=True):
        verdict = str(e.verdict)
        where = f"  ({e.where})" if verdict else ""
        ax.text(0.0, y - step, f"{e.name}{where}", fontsize=11,
                fontweight="bold", va="top", transform=ax.transAxes)
        ax.text(0.55, y - step, verdict.upper(), fontsize=11, fontweight="bold", va="top",
                color=VERDICT_COLOURS.get(verdict, "black"), transform=ax.transAxes,
                bbox={"facecolor": "white", "edgecolor": VERDICT_COLOURS.get(verdict, "black")} if verdict else None)
        for k, line in enumerate(wrapped):
            ax.text(0.02, y - step * (k + 2), line, fontsize=9, va="top", transform=ax.transAxes)
        y -= step * (len(wrapped) + 1)
    ax.set_title("Out-of-band events and the analyzer's verdict", loc="left")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def hardware(view: HardwareView, path: Path) -> Path | None:
    """The culprit GPUs against their peers: per level (SM clock, temperature, power, and the
    rates of link signals) each culprit GPU's median before and after the onset beside the peer
    GPUs' median; per clock-event reason its share of the samples before, after and on the
    peers. None (no file) when the record has nothing to draw."""
    levels, shares = hardware_levels(view), hardware_shares(view)
    panels = len(levels) + bool(shares)
    if not panels:
        return None
    plt = _pyplot()
    cols = 2 if panels == 4 else min(panels, 3)
    rows = -(-panels // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(10, 3.3 * rows + 0.5), dpi=DPI, squeeze=False)
    names = [p for p, _ in PHASE_COLOURS]
    for ax, (label, unit, bars) in zip(axes.flat, levels, strict=False):
        x = np.arange(len(bars))
        for k, (phase, colour) in enumerate(PHASE_COLOURS):
            heights = [np.nan if b[1 + k] is None else b[1 + k] for b in bars]
            ax.bar(x + (k - 1) * 0.27, heights, 0.27, color=colour, label=_phase_label(phase))
        ax.set_xticks(x, [b[0] for b in bars], rotation=30 if len(bars) > 4 else 0, fontsize=8,
                      ha="right" if len(bars) > 4 else "center")
        ax.set_title(f"{label} ({unit})" if unit else label, fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(axis="y", alpha=0.3)
    if shares:
        ax = axes.flat[len(levels)]
        x = np.arange(len(shares))
        for k, phase in enumerate(names):
            heights = [np.nan if s[1 + k] is None else 100 * s[1 + k] for s in shares]
            bars = ax.bar(x + (k - 1) * 0.27, heights, 0.27, color=PHASE_COLOURS[k][1], label=_phase_label(phase))
            for b, h in zip(bars, heights, strict=True):
                if np.isfinite(h):
                    ax.annotate(f"{h:.0f}%", (b.get_x() + b.get_width() / 2, h), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, [s[0] for s in shares], rotation=20 if len(shares) > 2 else 0, fontsize=8)
        ax.set_ylim(0, 112)
        ax.set_ylabel("% of samples", fontsize=9)
        ax.set_title("clock-event reasons (median over the culprit GPUs)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.45 / fig.get_figheight()),
               ncol=3, fontsize=8, frameon=False)
    more = f"; the first {MAX_HARDWARE_GPUS} of {len(view.gpus)} GPUs" if len(view.gpus) > MAX_HARDWARE_GPUS else ""
    hosts = sorted({str(e.get("host")) for e in view.gpus})
    fig.suptitle(f"{view.verdict}: culprit GPUs on {', '.join(hosts[:3])}{' ...' if len(hosts) > 3 else ''} "
                 f"against {view.peer_gpus} peer GPUs ({view.source}{more})", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / fig.get_figheight()))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _phase_label(phase: str) -> str:
    return {"before": "culprit, before onset", "after": "culprit, after onset", "peers": "peer GPUs (median)"}[phase]


def _short(incident: Incident) -> str:
    return format_ranks(incident.ranks)
