"""The incident report: written from the store, opened in headless Chromium, the culprit band visible,
the culprit GPUs' hardware evidence shown (IL-0477's real thermal record; a small job's incident with
no record, ``no_data``, ``unavailable`` and a hand-built ``hardware_fault`` record)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from analyzer.diagnosis.hardware_verdict import unavailable
from analyzer.service.run_once import run_once
from dashboards.report import write_report
from rankscope import schema
from rankscope.cli import main
from rankscope.incident import incidents_frame, load_incident
from rankscope.store import EmbeddedStore
from rankscope.topology import parse_ranks
from simulator.scenario import Scenario
from simulator.simulate import simulate
from tests.il0477_store import IncidentData

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


@pytest.fixture(scope="session")
def il0477(il0477_incident) -> IncidentData:
    return il0477_incident


@pytest.fixture(scope="module")
def report(il0477, tmp_path_factory):
    """The report of the latest incident, written by ``rankscope report`` (write_report underneath)."""
    out = tmp_path_factory.mktemp("report")
    mp = pytest.MonkeyPatch()
    mp.setenv("RANKSCOPE_INFLUX_API", "v1")
    try:
        with contextlib.redirect_stdout(io.StringIO()) as stdout:
            rc = main(["report", "--store", il0477.url, "--bucket", il0477.db, "--latest", "--out", str(out)])
    finally:
        mp.undo()
    assert rc == 0
    page = out / "index.html"
    assert stdout.getvalue().strip() == str(page)
    return page, json.loads((out / "report.json").read_text())


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    assert exe, "headless Chromium is needed (Debian: apt-get install chromium; `make test` installs it)"
    return exe


def _luminance(png) -> np.ndarray:
    import matplotlib.image as mpimg

    rgb = mpimg.imread(png)[..., :3]
    return rgb @ np.array([0.2126, 0.7152, 0.0722])


def _after_onset(lum: np.ndarray, geo: dict, meta: dict) -> np.ndarray:
    """Pixel columns of the iterations after the onset (one iteration of margin)."""
    cols = np.array(geo["columns"])
    col_of_pixel = cols[np.minimum((np.arange(lum.shape[1]) * len(cols)) // lum.shape[1], len(cols) - 1)]
    late = col_of_pixel > meta["onset_iteration"]
    assert late.sum() >= 3, "the incident data has too few iterations after the onset"
    return lum[:, late]


def test_report_names_the_culprits_and_links_its_figures(report, il0477):
    page, meta = report
    text = page.read_text()
    for section in ("Symptom", "Cause", "Detection", "Evidence"):
        assert f">{section}</h2>" in text
    assert "10352-10359" in text and "1294" in text
    assert "<th>Cost</th><td>" in text and "<th>Cost</th><td>Cost:" not in text     # said once
    assert "GPU-hours lost" in text.split("<th>Cost</th><td>")[1].split("</td>")[0]
    assert parse_ranks("10352-10359").tolist() == meta["culprits"]
    for name in meta["figures"].values():
        assert (page.parent / name).stat().st_size > 5_000
        assert f'src="{name}"' in text
    assert {"timeline", "heatmap_stage", "heatmap_dp", "stages", "verdicts", "hardware"} <= set(meta["figures"])


def _section(text: str, anchor: str) -> str:
    """The page from ``<h2 id=anchor>`` to the next ``<h2`` (or the end)."""
    start = text.index(f'<h2 id="{anchor}">')
    end = text.find("<h2", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_report_shows_the_culprit_gpus_thermal_evidence_and_its_figure(report):
    """IL-0477's record as the analyzer stored it (the simulator's gpu_health for node 1294)."""
    page, meta = report
    section = _section(page.read_text(), "hardware")
    assert meta["hardware_verdict"] == "hardware_fault" and meta["figures"]["hardware"] == "hardware.png"
    assert 'class="hardware hardware_fault">hardware_fault</b> (from gpu_health' in section
    assert "gpu_health: gpu-node-01294 GPUs 0-7: hw_thermal_slowdown in " in section
    assert re.findall(r"<tr><td>gpu-node-01294</td><td>(\d+)</td>", section) == [str(k) for k in range(8)]
    assert re.search(r"hw_thermal_slowdown \d+% → \d+% of samples \(peers 0%\)", section) and 'src="hardware.png"' in section
    # the after-onset bars (red) are drawn
    import matplotlib.image as mpimg

    rgb = mpimg.imread(page.parent / "hardware.png")[..., :3]
    red = (np.abs(rgb - np.array([0xd6, 0x27, 0x28]) / 255).max(axis=-1) < 0.05).mean()
    assert red > 0.01, red


def test_heatmap_png_shows_the_culprit_band(report):
    page, meta = report
    geo = meta["heatmaps"]["heatmap_stage"]
    assert geo["stage"] == "mlp"
    lum = _luminance(page.parent / geo["file"])[geo["top"]:geo["bottom"], geo["left"]:geo["right"]]
    rows = np.array(geo["rows"])
    row_of_pixel = rows[np.minimum((np.arange(lum.shape[0]) * len(rows)) // lum.shape[0], len(rows) - 1)]
    late = _after_onset(lum, geo, meta)
    culprit = np.isin(row_of_pixel, meta["culprits"])
    assert culprit.any() and (~culprit).any()
    band, rest = late[culprit].mean(), late[~culprit].mean()
    assert band > 0.6 and rest < 0.35 and band > 2.5 * rest, (band, rest)


def test_dp_heatmap_shows_the_short_reduce_scatter_band(report):
    page, meta = report
    geo = meta["heatmaps"]["heatmap_dp"]
    assert geo["stage"] == "reduce_scatter"
    lum = _luminance(page.parent / geo["file"])[geo["top"]:geo["bottom"], geo["left"]:geo["right"]]
    rows = np.array(geo["rows"])
    row_of_pixel = rows[np.minimum((np.arange(lum.shape[0]) * len(rows)) // lum.shape[0], len(rows) - 1)]
    dp = row_of_pixel % 1440
    late = _after_onset(lum, geo, meta)
    inside = (dp >= 258) & (dp <= 285)  # a margin of 2 rows against antialiased edges
    outside = (dp < 250) | (dp > 293)
    assert late[inside].mean() < 0.6 * late[outside].mean()  # short = dark, at every pp stage
    assert len(set(row_of_pixel[inside] // 1440)) == 9


def test_report_opens_in_headless_chromium_with_every_figure(report, tmp_path):
    page, meta = report
    chromium = _chromium()
    flags = [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "screenshot.png"
    subprocess.run([chromium, *flags, f"--screenshot={shot}", "--window-size=1280,2400",
                    page.as_uri()], check=True, capture_output=True, timeout=120)
    lum = _luminance(shot)
    assert lum.shape[:2] == (2400, 1280)
    assert (lum < 0.5).mean() > 0.02  # figures and text drawn, not a blank page
    dom = subprocess.run([chromium, *flags, "--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         check=True, capture_output=True, text=True, timeout=120).stdout
    loaded = re.search(r'data-figures-loaded="(\d+)"', dom)
    total = re.search(r'data-figures="(\d+)"', dom)
    assert loaded and total, dom[-500:]
    assert int(loaded.group(1)) == int(total.group(1)) == len(meta["figures"])


def test_write_report_refuses_an_unknown_incident(il0477, tmp_path, capsys, monkeypatch):
    with pytest.raises(ValueError, match="no incident 'no-such-id'"):
        write_report(il0477.store, il0477.job, tmp_path, incident_id="no-such-id")
    monkeypatch.setenv("RANKSCOPE_INFLUX_API", "v1")
    assert main(["report", "--store", il0477.url, "--bucket", il0477.db, "--incident", "no-such-id",
                 "--out", str(tmp_path)]) == 1
    assert "no incident 'no-such-id'" in capsys.readouterr().err
    assert main(["report", "--store", il0477.url, "--bucket", il0477.db, "--job", "nope",
                 "--out", str(tmp_path)]) == 1
    assert "no job 'nope'" in (err := capsys.readouterr().err) and f"jobs there: {il0477.job}" in err


# ---------------------------------------------------------------- a small job's records, one at a time
SMALL = {"topology": {"tp": 1, "pp": 2, "dp": 16, "ep": 4, "gpus_per_node": 8},
         "run": {"job": "small-hw", "iterations": 50, "seed": 3},
         "fault": [{"kind": "compute_slowdown", "ranks": "8-15", "stage": "mlp", "factor": 4.0, "start": 25}]}
HOST = "gpu-node-00001"


@pytest.fixture(scope="module")
def small_job(tmp_path_factory) -> Path:
    """An embedded store holding a small job's straggler node, analyzed (no gpu_health written)."""
    db = tmp_path_factory.mktemp("small-hw") / "store.db"
    store = EmbeddedStore(db)
    try:
        simulate(Scenario.from_dict(SMALL), store, start_ms=1_750_000_000_000, progress=False)
        (inc,) = run_once(store)
    finally:
        store.close()
    assert inc["hosts"] == [HOST] and inc["gpus"]
    return db


def _report_with(small_job: Path, tmp_path: Path, hardware: dict | None) -> tuple[str, dict, Path]:
    """The small job's report with its incident's ``hardware`` record replaced (None: as analyzed)."""
    db = tmp_path / "store.db"
    shutil.copy(small_job, db)
    store = EmbeddedStore(db)
    try:
        inc = load_incident(store, "small-hw")
        if hardware is not None:
            inc.hardware, inc.updated_ms = hardware, inc.updated_ms + 1
            store.write_measurement(schema.INCIDENT, incidents_frame([inc]))
            assert load_incident(store, "small-hw", inc.id).hardware == hardware
        page = write_report(store, "small-hw", tmp_path / "report")
    finally:
        store.close()
    return page.read_text(), json.loads((page.parent / "report.json").read_text()), page.parent


def _level(before: float, after: float, peers: float) -> dict:
    return {"before": before, "after": after, "peers": peers}


def hand_built_fault() -> dict:
    """A ``hardware_fault`` record in analyzer/diagnosis/hardware_verdict.py's shape: GPUs 0-5 of the
    culprit host hot and throttling (one with an XID), 6-7 clean, power capping on every GPU (context)."""
    def gpu(k: int) -> dict:
        hot = k < 6
        signals = [{"signal": "hw_thermal_slowdown", "share_before": 0.0, "share_after": 0.9, "share_peers": 0.0},
                   {"signal": "temperature_c", "before": 66.0, "after": 93.0, "peers": 65.0}] if hot else []
        if k == 2:
            signals.append({"signal": "xid", "samples_after": 2, "samples_before": 0, "share_peers": 0.0,
                            "xids": [{"code": 79, "meaning": "GPU has fallen off the bus"}]})
        return {"host": HOST, "gpu": k, "uuid": f"GPU-00000000-0000-0000-0000-00000000000{k}", "ranks": [8 + k],
                "samples": {"before": 60, "after": 30},
                "sm_clock_mhz": _level(1980.0, 1105.0 if hot else 1975.0, 1980.0),
                "temperature_c": _level(66.0, 93.0 if hot else 67.0, 65.0),
                "power_w": _level(650.0, 420.0 if hot else 640.0, 655.0),
                "signals": signals, "context": ["sw_power_cap"]}

    return {"verdict": "hardware_fault", "source": "gpu_health", "gpus": [gpu(k) for k in range(8)], "peer_gpus": 24,
            "phrase": "GPU thermal throttling", "checked": "clocks, temperature, power", "final": True,
            "sources": {"gpu_health": "hardware_fault"},
            "summary": f"gpu_health: {HOST} GPUs 0-5: hw_thermal_slowdown in 90% of samples after the onset "
                       f"(0% before, 0% on 24 peer GPUs); temperature 93 °C (66 before, 65 on the peers)."}


def test_a_hand_built_hardware_fault_gets_its_table_and_figure(small_job, tmp_path):
    text, meta, out = _report_with(small_job, tmp_path, hand_built_fault())
    section = _section(text, "hardware")
    assert meta["figures"]["hardware"] == "hardware.png" and (out / "hardware.png").stat().st_size > 5_000
    assert meta["hardware_verdict"] == "hardware_fault" and 'src="hardware.png"' in section
    assert f"gpu_health: {HOST} GPUs 0-5: hw_thermal_slowdown in 90% of samples" in section
    rows = re.findall(r"<tr><td>([^<]*)</td><td>(\d+)</td><td class=\"mono\">([^<]*)</td><td>([^<]*)</td>", section)
    assert rows == [(HOST, str(k), f"GPU-00000000-0000-0000-0000-00000000000{k}", str(8 + k)) for k in range(8)]
    assert "XID 79: GPU has fallen off the bus" in section and "context (on the peers or before too): sw_power_cap" in section
    assert "<td>1105</td><td>1980</td>" in section          # SM clock after, peers
    assert "<th colspan=\"3\">temperature (°C)</th>" in section
    assert "against 24 peer GPUs" not in section             # the figure's words stay in the figure


@pytest.mark.parametrize("record, words", [
    ({}, "No hardware evidence for this incident"),
    (unavailable("prometheus", "Prometheus http://p:9090/api/v1/query_range: cannot reach it"),
     "prometheus unavailable: Prometheus http://p:9090/api/v1/query_range: cannot reach it; tried again next cycle."),
    (None, f"gpu_health: no series for the culprit GPUs ({HOST})"),   # the analyzer's own: nothing written
], ids=["no-record", "unavailable", "no-data"])
def test_without_compared_gpus_the_section_says_why_and_draws_nothing(small_job, tmp_path, record, words):
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "hardware.png").write_bytes(b"an earlier report's figure")
    text, meta, out = _report_with(small_job, tmp_path, record)
    section = _section(text, "hardware")
    assert words in section
    assert "hardware" not in meta["figures"] and not (out / "hardware.png").exists()
    assert "<table" not in section and "<img" not in section
    assert {"timeline", "stages", "verdicts"} <= set(meta["figures"])
    assert meta["hardware_verdict"] == (record or {}).get("verdict", "no_data" if record is None else None)
