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

from dashboards.report_data import IncidentWindow
from rankscope.incident import EventVerdict, Incident
from rankscope.topology import format_ranks

DPI = 100
VERDICT_COLOURS = {"contradicted": "#d62728", "supported": "#2ca02c", "unrelated": "#7f7f7f"}


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


def _short(incident: Incident) -> str:
    return format_ranks(incident.ranks)
