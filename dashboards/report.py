"""``rankscope report``: one incident as a record people read, an HTML page with PNG figures.

Laid out like an incident write-up: symptom (iteration-time timeline with the
change point), cause (culprit ranks, node, stage, class), detection (L1 and L2
findings), evidence (rank x stage heatmaps around the culprits, the culprits'
stages against their group, the verdict on every out-of-band event).
``report.json`` beside the page lists the figures and where each heatmap's
rows lie in its PNG.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

import numpy as np

from dashboards import report_figures as figs
from dashboards.report_data import (
    IncidentRecord,
    IncidentWindow,
    dp_band_rows,
    load_incident,
    load_window,
    rows_around,
    stage_comparison,
)
from rankscope.store import Store, open_store
from rankscope.topology import format_ranks

#: Iterations of stage latencies read (and drawn) before and after the onset.
ITERATIONS_BEFORE = 20
ITERATIONS_AFTER = 20
ACTIONS = {
    "compute_straggler": "Drain and replace node(s) {nodes}: the slowness is in compute-only work on "
                         "those GPUs; network repairs will not restore the speed.",
    "link_degradation": "Check the NIC / links of node(s) {nodes}: the transfer floor of their collectives rose.",
    "pipeline_imbalance": "Rebalance the pipeline stages: stage {stage} takes longer than the others.",
    "transient_stall": "No action unless it repeats: a short stall that passed on its own.",
    "host_stall": "Check the host side (data loader, CPU, storage) of node(s) {nodes}.",
    "silent_rank": "Ranks {ranks} stopped reporting: check the processes and node(s) {nodes}.",
}


def _progress(msg: str) -> None:
    print(f"report: {msg}", file=sys.stderr, flush=True)


def write_report(store: Store, job: str, out_dir: str | Path, incident_id: str | None = None,
                 progress: bool = False) -> Path:
    """Write ``index.html`` and its figures for one incident (the latest one by default); its path."""
    say = _progress if progress else (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    incident = load_incident(store, job, incident_id)
    say(f"incident {incident.id} ({incident.cls}, {incident.status}); reading stage latencies")
    window = load_window(store, incident, ITERATIONS_BEFORE, ITERATIONS_AFTER)
    say(f"{window.cube.values.shape[0]} iterations x {window.topology.world} ranks; drawing figures")
    figures: dict[str, str] = {"timeline": figs.timeline(window, incident, out / "timeline.png").name}
    heatmaps = _heatmaps(window, incident, out)
    figures.update({key: geo.file for key, geo in heatmaps.items()})
    figures["stages"] = figs.stage_bars(stage_comparison(window, incident), incident, out / "stages.png").name
    figures["verdicts"] = figs.verdicts(incident, out / "verdicts.png").name
    page = out / "index.html"
    page.write_text(_html(incident, window, figures, heatmaps), encoding="utf-8")
    (out / "report.json").write_text(json.dumps({
        "incident": incident.id, "job": incident.job, "class": incident.cls, "figures": figures,
        "onset_iteration": incident.onset_iteration, "resolved_iteration": incident.resolved_iteration,
        "heatmaps": {k: g.to_json() for k, g in heatmaps.items()},
        "culprits": incident.ranks.tolist()}, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    say(f"wrote {page}")
    return page


def _heatmaps(window: IncidentWindow, incident: IncidentRecord, out: Path) -> dict[str, figs.HeatmapGeometry]:
    topo, found = window.topology, {}
    if not incident.ranks.size:
        return found
    group = incident.group_ranks if incident.group_ranks.size else incident.ranks
    stage = incident.stage if incident.stage in window.stages else window.stages[0]
    pad = max(len(group), 16)
    rows = rows_around(group, topo.world, pad)
    marks = {int(np.flatnonzero(rows == incident.ranks.min())[0]): f"◀ {format_ranks(incident.ranks)}"}
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


def _esc(x: object) -> str:
    return html.escape(str(x))


def _html(incident: IncidentRecord, window: IncidentWindow, figures: dict[str, str],
          heatmaps: dict[str, figs.HeatmapGeometry]) -> str:
    ev = incident.evidence
    nodes, ranks = format_ranks(incident.nodes), format_ranks(incident.ranks)
    it_ms = window.cube.iteration_ms
    before = window.cube.iterations < incident.onset_iteration
    after = window.after(incident)
    with np.errstate(all="ignore"):
        med = np.nanmedian(it_ms, axis=1) / 1000
    t_before = float(np.nanmedian(med[before])) if before.any() else float("nan")
    t_after = float(np.nanmedian(med[after])) if after.any() else float("nan")
    group = ev.get("group") or {}
    action = ACTIONS.get(incident.cls, "Investigate node(s) {nodes}.").format(
        nodes=nodes, ranks=ranks, stage=incident.stage)
    rows = [("Class", incident.cls.replace("_", " ")), ("Status", incident.status),
            ("Culprit ranks", ranks), ("Node(s)", nodes), ("Stage", incident.stage),
            ("Ratio to group median", f"{incident.ratio:.2f}x"),
            ("Group", f"{incident.group_type} {format_ranks(incident.group_ranks)}"
                      + (f" (id {group['id']})" if "id" in group else "")),
            ("Onset iteration", incident.onset_iteration),
            ("Resolved iteration", incident.resolved_iteration if incident.resolved_iteration >= 0 else "open")]
    facts = "\n".join(f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in rows)
    events = "\n".join(
        f"<tr><td>{_esc(e.get('name', ''))}</td><td>{_esc(e.get('node', ''))}</td>"
        f"<td class='verdict {_esc(e.get('verdict', ''))}'>{_esc(e.get('verdict', ''))}</td>"
        f"<td>{_esc(e.get('reason', ''))}</td></tr>" for e in incident.events) or \
        "<tr><td colspan='4'>No out-of-band events near the incident.</td></tr>"

    def img(key: str, alt: str) -> str:
        return f"<figure><img id='{key}' src='{_esc(figures[key])}' alt='{_esc(alt)}'><figcaption>{_esc(alt)}</figcaption></figure>" \
            if key in figures else ""

    evidence_detail = ""
    if ev:
        shown = {k: ev[k] for k in ("stage", "ratio", "culprit_ms", "group_median_ms") if k in ev}
        evidence_detail = "<p class='mono'>" + _esc(json.dumps(shown)) + "</p>"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Incident {_esc(incident.id)}: {_esc(incident.title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1080px; margin: 2em auto; color: #222; }}
h1 {{ font-size: 1.5em; margin-bottom: 0.2em; }} h2 {{ border-bottom: 2px solid #ddd; padding-bottom: 0.2em; }}
.status {{ display: inline-block; padding: 0.1em 0.6em; border-radius: 4px; color: white;
          background: {'#d62728' if incident.status == 'open' else '#2ca02c'}; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }} th, td {{ text-align: left; padding: 0.25em 0.8em;
        border-bottom: 1px solid #eee; vertical-align: top; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; border: 1px solid #ddd; }}
figcaption {{ color: #555; font-size: 0.9em; }} .mono {{ font-family: monospace; color: #444; }}
.verdict.contradicted {{ color: #d62728; font-weight: bold; }} .verdict.supported {{ color: #2ca02c; font-weight: bold; }}
.action {{ background: #fff4e5; border-left: 4px solid #ff7f0e; padding: 0.6em 1em; }}
</style></head>
<body>
<h1>{_esc(incident.title)}</h1>
<p>Incident <b>{_esc(incident.id)}</b> on job <b>{_esc(incident.job)}</b> <span class="status">{_esc(incident.status)}</span></p>
<p class="action"><b>What to do:</b> {_esc(action)}</p>

<h2 id="symptom">Symptom</h2>
<p>The job's median iteration time went from {t_before:.1f} s to {t_after:.1f} s at iteration
{incident.onset_iteration}.</p>
{img("timeline", "Iteration time per iteration (median and slowest rank) with the change point")}

<h2 id="cause">Cause</h2>
<table>{facts}</table>
<p>{_esc(incident.text)}</p>

<h2 id="detection">Detection</h2>
<p>L1 watched the iteration time and found the step at iteration {incident.onset_iteration}. L2 compared the
stages of the ranks inside each parallel group: in <b>{_esc(incident.stage)}</b> ranks {_esc(ranks)} took
{incident.ratio:.2f}x the median of their {_esc(incident.group_type)} group {_esc(format_ranks(incident.group_ranks))}.</p>
{evidence_detail}

<h2 id="evidence">Evidence</h2>
{img("heatmap_stage", "Rank x iteration heatmap of the incident's stage around the culprits (bright = slow)")}
{img("heatmap_dp", "The DP collective of the culprits' dp range at every pp stage: short (dark) where the pipelines arrived late")}
{img("stages", "Culprits' stages against their group-mates after the onset")}
<h3>Out-of-band events</h3>
<table><tr><th>event</th><th>node</th><th>verdict</th><th>reason</th></tr>
{events}
</table>
{img("verdicts", "Verdict on each out-of-band event")}
<p class="mono">{len(heatmaps)} heatmap(s); figures listed in report.json.</p>
<script>
// Marks how many figures the browser decoded (read by the report's browser test).
window.addEventListener("load", () => {{
  const imgs = [...document.images];
  document.body.dataset.figuresLoaded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.figures = imgs.length;
}});
</script>
</body></html>
"""


# ---------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "report", help="write an incident report (HTML page with PNG figures)",
        description="Write one incident as an HTML page with PNG figures, laid out like an incident "
                    "record: symptom (iteration-time timeline with the change point), cause, detection, "
                    "evidence (rank x stage heatmaps around the culprits, the culprits' stages against "
                    "their group, the verdict on each out-of-band event). Prints the page's path.")
    add_store_options(p)
    p.add_argument("--job", help="job of the incident (default: the store's only job)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--incident", metavar="ID", help="incident id (see the NOC dashboard or `rankscope analyze`)")
    which.add_argument("--latest", action="store_true", help="the job's most recent incident (the default)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="folder to write index.html and figures to")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.store, args.bucket) as store:
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
