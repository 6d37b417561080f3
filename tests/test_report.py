"""The incident report: written from the store, opened in headless Chromium, the culprit band visible."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess

import numpy as np
import pytest

from dashboards.report import write_report
from rankscope.cli import main
from rankscope.topology import parse_ranks
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
    assert {"timeline", "heatmap_stage", "heatmap_dp", "stages", "verdicts"} <= set(meta["figures"])


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
