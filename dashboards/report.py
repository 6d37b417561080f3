"""``rankscope report``: one incident as a record people read, an HTML page with PNG figures.

Laid out like an incident write-up: symptom (iteration-time timeline with the
change point), cause (culprit ranks, node, stage, class), detection (L1 and L2
findings), evidence (rank x stage heatmaps around the culprits, the culprits'
stages against their group, the verdict on every out-of-band event), hardware
evidence (the incident's ``hardware`` record: verdict, summary, a table of the
culprit GPUs and a figure of them against their peers; an incident without a
record says so, and ``no_data`` / ``unavailable`` show their summary only).
``report.json`` beside the page lists the figures and where each heatmap's
rows lie in its PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import numpy as np
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from dashboards import report_figures as figs
from dashboards.report_data import (
    HARDWARE_LEVELS,
    HardwareView,
    IncidentWindow,
    dp_band_rows,
    hardware_view,
    load_window,
    rows_around,
    stage_comparison,
)
from rankscope.cli import add_store_options, require_jobs
from rankscope.incident import Incident, load_incident
from rankscope.store import Store, open_store
from rankscope.topology import format_ranks

_TEMPLATES = Environment(loader=PackageLoader("dashboards", "templates"),
                         autoescape=select_autoescape(["html", "j2"]), undefined=StrictUndefined,
                         trim_blocks=False, lstrip_blocks=False)

#: Iterations of stage latencies read (and drawn) before and after the onset.
ITERATIONS_BEFORE = 20
ITERATIONS_AFTER = 20


def _progress(msg: str) -> None:
    print(f"report: {msg}", file=sys.stderr, flush=True)


def write_report(store: Store, job: str, out_dir: str | Path, incident_id: str | None = None,
                 progress: bool = False) -> Path:
    """Write ``index.html`` and its figures for one incident (the latest one by default); its path."""
    say = _progress if progress else (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    incident = load_incident(store, job, incident_id)
    say(f"incident {incident.id} ({incident.cls.value}, {incident.status.value}); reading stage latencies")
    window = load_window(store, incident, ITERATIONS_BEFORE, ITERATIONS_AFTER)
    say(f"{window.cube.values.shape[0]} iterations x {window.topology.world} ranks; drawing figures")
    figures: dict[str, str] = {"timeline": figs.timeline(window, incident, out / "timeline.png").name}
    heatmaps = _heatmaps(window, incident, out)
    figures.update({key: geo.file for key, geo in heatmaps.items()})
    figures["stages"] = figs.stage_bars(stage_comparison(window, incident), incident, out / "stages.png").name
    figures["verdicts"] = figs.verdicts(incident, out / "verdicts.png").name
    hardware = hardware_view(incident.hardware)
    drawn = figs.hardware(hardware, out / "hardware.png") if hardware.compared else None
    if drawn is not None:
        figures["hardware"] = drawn.name
    else:
        (out / "hardware.png").unlink(missing_ok=True)   # an earlier report's, in a reused folder
    page = out / "index.html"
    page.write_text(_page(incident, window, figures, heatmaps, hardware), encoding="utf-8")
    (out / "report.json").write_text(json.dumps({
        "incident": incident.id, "job": incident.job, "class": incident.cls.value, "figures": figures,
        "hardware_verdict": hardware.verdict or None,
        "onset_iteration": incident.onset_iteration, "resolved_iteration": incident.resolved_iteration,
        "heatmaps": {k: g.to_json() for k, g in heatmaps.items()},
        "culprits": [int(r) for r in incident.ranks], "hosts": incident.hosts}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    say(f"wrote {page}")
    return page


def _heatmaps(window: IncidentWindow, incident: Incident, out: Path) -> dict[str, figs.HeatmapGeometry]:
    topo, found = window.topology, {}
    culprits = np.asarray(incident.ranks, dtype=np.int64)
    if not culprits.size:
        return found
    group = np.asarray(incident.group_ranks or incident.ranks, dtype=np.int64)
    stage = incident.stage if incident.stage in window.stages else window.stages[0]
    pad = max(len(group), 16)
    rows = rows_around(group, topo.world, pad)
    marks = {int(np.flatnonzero(rows == culprits.min())[0]): f"◀ {format_ranks(culprits)}"}
    found["heatmap_stage"] = figs.rank_heatmap(
        window, stage, rows, out / f"heatmap_{stage}.png",
        f"{stage}: ranks {rows[0]}-{rows[-1]} around the culprits ({incident.group_type or 'group'} "
        f"{format_ranks(group)})", marks=marks, onset_iteration=incident.onset_iteration)
    dp_stages = [s for s in ("reduce_scatter", "all_gather") if s in window.stages]
    if dp_stages and topo.pp > 1:
        band, pp, dp = dp_band_rows(topo, group, pad=len(group))
        gdp = topo.dp_index[group]
        starts = [int(i) for i in np.flatnonzero(np.r_[True, pp[1:] != pp[:-1]])]
        marks_dp = {int(s + (gdp.min() - dp[s])): f"pp{pp[s]} dp {gdp.min()}-{gdp.max()}" for s in starts}
        found["heatmap_dp"] = figs.rank_heatmap(
            window, dp_stages[0], band, out / f"heatmap_{dp_stages[0]}.png",
            f"{dp_stages[0]}: dp {dp[0]}-{dp[-1]} at every pp stage (rows pp-major)",
            marks=marks_dp, separators=starts[1:], onset_iteration=incident.onset_iteration)
    return found


def _page(incident: Incident, window: IncidentWindow, figures: dict[str, str],
          heatmaps: dict[str, figs.HeatmapGeometry], hardware: HardwareView) -> str:
    """The report page from its Jinja2 template (autoescaped)."""
    ev = incident.evidence
    nodes, ranks = format_ranks(incident.nodes), format_ranks(incident.ranks)
    it_ms = window.cube.iteration_ms
    before = window.cube.iterations < incident.onset_iteration
    after = window.after(incident)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(it_ms, axis=1) / 1000
    t_before = float(np.nanmedian(med[before])) if before.any() else float("nan")
    t_after = float(np.nanmedian(med[after])) if after.any() else float("nan")
    group = ev.get("group") or {}
    action = incident.action
    facts = [("Class", incident.cls.label), ("Status", incident.status.value),
             ("Culprit ranks", ranks), ("Host(s)", ", ".join(incident.hosts) or "not reported"),
             ("Node(s)", nodes), ("Stage", incident.stage),
             ("Ratio to group median", f"{incident.ratio:.2f}x"),
             ("Group", f"{incident.group_type} {format_ranks(incident.group_ranks)}"
                       + (f" (id {group['id']})" if "id" in group else "")),
             ("Onset iteration", incident.onset_iteration
              if not incident.intermittent else f"{incident.first_onset} (intermittent: {incident.episodes} "
                                                f"episodes, last from {incident.last_onset})"),
             ("Cost", incident.cost.removeprefix("Cost: ") or "not known (no iterations before the onset)"),
             ("Resolved iteration", incident.resolved_iteration if incident.resolved_iteration >= 0 else "open")]
    facts += [("Kernels (L3)", "; ".join(f"{k['kernel']} {k['ratio']:g}x ({k['kind']}, {k['cause']}, rank(s) "
                                         f"{k['ranks']})" for k in ev["kernels"]))] if ev.get("kernels") else []
    facts += [("Host-side", f"the GPUs ran no kernel for {ev['host_gap_ms']:g} ms: the host did not launch")] \
        if "host_gap_ms" in ev else []
    shown = {k: ev[k] for k in ("stage", "ratio", "culprit_ms", "group_median_ms") if k in ev}
    return _TEMPLATES.get_template("report.html.j2").render(
        incident=incident, action=action, facts=facts, ranks=ranks,
        group_ranks=format_ranks(incident.group_ranks), t_before=t_before, t_after=t_after,
        evidence_numbers=json.dumps(shown) if shown else "", figures=figures, restarts=window.restarts or [],
        heatmap_count=len(heatmaps), hardware=hardware, hardware_levels=[f"{label} ({unit})" for _, label, unit in HARDWARE_LEVELS])


# ---------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="write an incident report (HTML page with PNG figures)",
        description="Write one incident as an HTML page with PNG figures, laid out like an incident "
                    "record: symptom (iteration-time timeline with the change point), cause, detection, "
                    "evidence (rank x stage heatmaps around the culprits, the culprits' stages against "
                    "their group, the verdict on each out-of-band event), hardware evidence (the culprit "
                    "GPUs' telemetry against their peers, where the analyzer checked it). Prints the page's path.")
    add_store_options(p)
    p.add_argument("--job", help="job of the incident (default: the store's only job)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--incident", metavar="ID", help="incident id (see the NOC dashboard or `rankscope analyze`)")
    which.add_argument("--latest", action="store_true", help="the job's most recent incident (the default)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to write index.html and figures to")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out} is a file; the report is a folder (index.html and figures)")
    with open_store(args.store, args.bucket, create=False) as store:
        require_jobs(store, [args.job] if args.job else None)
        job = args.job
        if job is None:
            jobs = store.jobs()
            if not jobs:
                raise ValueError(f"{store!r} holds no jobs (no stage_latency points): nothing to report")
            if len(jobs) > 1:
                raise ValueError(f"pass --job: the store holds {len(jobs)} jobs ({', '.join(jobs[:10])})")
            job = jobs[0]
        page = write_report(store, job, args.out, None if args.latest else args.incident, progress=True)
    print(page)
    return 0
