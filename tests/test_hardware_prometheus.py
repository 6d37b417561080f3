"""Hardware evidence from dcgm-exporter's metrics in a real Prometheus (Debian's 2.42), its TSDB
backfilled with ``promtool tsdb create-blocks-from openmetrics`` (tests/dcgm_series.py): the
culprit GPUs against their own baseline and the job's other GPUs, through the real
:class:`~analyzer.service.hardware_evidence.HardwareEvidence` and
:class:`~analyzer.read.dcgm_prometheus.DcgmPrometheus`.

A throttling GPU under both names of field 112, a slow GPU with clean telemetry, a reason every GPU
shows, short, full and mapped host names, duplicate series, a counter reset, NaN and missing
series; then the server's faults: stopped (SIGSTOP: it accepts and never answers), an answer over
the byte limit, nothing listening, and a 5xx from a gateway in front of it. Each fault is one log
line and ``unavailable`` or ``no_data``, never an exception out of the cycle."""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import signal
import threading
import time

import pytest

from analyzer.read.dcgm_prometheus import DcgmPrometheus
from analyzer.service.hardware_config import HardwareSettings
from rankscope.bounded_http import bounded_get
from rankscope.incident import IncidentClass
from tests.dcgm_series import EVENTS, THROTTLE, BackfilledPrometheus, Job
from tests.hardware_incidents import check, incident, signals
from tests.influx_server import free_port

ONSET_MS = (int(time.time() * 1000) - 2 * 3600_000) // 60_000 * 60_000
RACK = {"rack-node-00": "r7-u01", "rack-node-01": "r7-u02", "rack-node-02": "r7-u03", "rack-node-03": "r7-u04"}
JOBS = {j.name: j for j in [
    Job("thr", "thermal", ONSET_MS, full_names=True, reasons_metric=THROTTLE, label_host=lambda h: h.split(".")[0]),
    Job("new", "power_brake", ONSET_MS, reasons_metric=EVENTS, label_host=lambda h: h.upper() + ".DC1.EXAMPLE.COM"),
    Job("clean", "clean", ONSET_MS),
    Job("decoy", "decoy", ONSET_MS, reasons_metric=EVENTS),
    Job("rack", "thermal", ONSET_MS, label_host=lambda h: RACK[h]),
    Job("dup", "thermal", ONSET_MS, duplicate=True),
    Job("pcie", "pcie", ONSET_MS),
    Job("nan", "nan", ONSET_MS),
    Job("ghost", "ghost", ONSET_MS),
]}
LOGGER = "analyzer.service.hardware_evidence"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    server = BackfilledPrometheus(list(JOBS.values()), tmp_path_factory.mktemp("dcgm-prometheus")).start()
    try:
        yield server
    finally:
        server.stop()


def hw_of(name: str, prom, **kw) -> dict:
    return check(JOBS[name], DcgmPrometheus(prom.url, **kw))[0].hardware


# ------------------------------------------------------------------------------ verdicts
def test_thermal_throttling_under_the_older_name_and_short_hostnames(prom):
    """Full names in the job, short ones in ``Hostname``, field 112 as CLOCK_THROTTLE_REASONS; two
    incidents on the host, one by index and one by UUID: one query for both."""
    job = JOBS["thr"]
    incs = [incident(job), incident(job, uuids=True, suffix="2")]
    src = DcgmPrometheus(prom.url)
    check(job, src, incs)
    for inc in incs:
        hw = inc.hardware
        assert hw["verdict"] == "hardware_fault" and hw["source"] == "prometheus" and hw["final"]
        assert {"hw_thermal_slowdown", "sw_thermal_slowdown", "temperature_c", "sm_clock_mhz"} <= signals(hw)
        assert [g["host"] for g in hw["gpus"]] == [job.hosts()[2]] * 4 and hw["peer_gpus"] == 12
        g = hw["gpus"][0]
        assert g["uuid"] == job.uuid(2, 0) and g["ranks"] == [8]
        assert g["temperature_c"]["after"] > 85 and g["temperature_c"]["before"] < 70 and g["temperature_c"]["peers"] < 70
        share = {s["signal"]: s for s in g["signals"]}["hw_thermal_slowdown"]
        assert share["share_after"] > 0.9 and share["share_before"] == 0 and share["share_peers"] == 0
        assert inc.title.startswith("compute straggler: GPU thermal throttling, ranks 8-11 on thr-node-02")
        assert "hw_thermal_slowdown in 100% of samples after the onset" in hw["summary"]


def test_power_brake_under_the_newer_name_and_upper_case_fqdns(prom):
    hw = hw_of("new", prom)
    assert hw["verdict"] == "hardware_fault" and hw["phrase"] == "GPU power brake"
    assert {"hw_power_brake", "sm_clock_mhz", "power_w"} <= signals(hw)
    assert "hw_thermal_slowdown" not in signals(hw)
    assert hw["gpus"][0]["host"] == "new-node-02" and hw["gpus"][0]["power_w"]["after"] < 300


def test_a_slow_gpu_with_clean_telemetry_is_no_hardware_signal(prom):
    hw = hw_of("clean", prom)
    assert hw["verdict"] == "no_hardware_signal" and signals(hw) == set() and hw["phrase"] == ""
    assert hw["summary"].endswith("look at software, data, the host.") and "12 peer GPUs" in hw["summary"]
    # 11 min after the onset at the 30 s step (MIN_STEP_S): 22 samples a GPU; the 30 min of baseline
    # in a query of its own at BASELINE_POINTS samples a series (a 120 s step)
    from analyzer.read.dcgm_prometheus import BASELINE_POINTS
    assert all(g["samples"]["after"] >= 20 and BASELINE_POINTS - 1 <= g["samples"]["before"] <= BASELINE_POINTS
               for g in hw["gpus"])


def test_a_reason_every_gpu_shows_from_the_onset_is_context_not_a_fault(prom):
    """SW power capping from the onset on every GPU of the job: new on the culprit, but its peers show it too."""
    hw = hw_of("decoy", prom)
    assert hw["verdict"] == "no_hardware_signal" and "sw_power_cap" not in signals(hw)
    assert all(g["context"] == ["sw_power_cap"] for g in hw["gpus"])
    assert "sw_power_cap is on the peers or before too: context" in hw["summary"]


def test_names_monitoring_knows_only_through_the_host_map(prom):
    assert hw_of("rack", prom)["verdict"] == "no_data"
    hw = hw_of("rack", prom, host_map=RACK)
    assert hw["verdict"] == "hardware_fault" and hw["gpus"][0]["host"] == "rack-node-02"
    assert hw["peer_gpus"] == 12


def test_duplicate_series_count_once(prom):
    dup, single = hw_of("dup", prom), hw_of("thr", prom)
    assert dup["verdict"] == "hardware_fault" and len(dup["gpus"]) == 4 and dup["peer_gpus"] == 12
    assert [g["samples"] for g in dup["gpus"]] == [g["samples"] for g in single["gpus"]]


def test_pcie_replays_as_a_rate_across_a_counter_reset(prom):
    job = JOBS["pcie"]
    hw = check(job, DcgmPrometheus(prom.url), [incident(job, IncidentClass.LINK_DEGRADATION)])[0].hardware
    assert hw["verdict"] == "hardware_fault" and hw["checked"] == "pcie, nvlink" and hw["phrase"] == "PCIe replays"
    rate = {s["signal"]: s for s in hw["gpus"][0]["signals"]}["pcie_replays"]
    assert 35 <= rate["after"] <= 55 and rate["before"] < 1 and rate["peers"] < 1   # ~50/s, the reset not negative
    # a compute straggler on the same GPUs is checked against clocks, temperature and power: nothing there
    assert hw_of("pcie", prom)["verdict"] == "no_hardware_signal"


@pytest.mark.parametrize("name", ["nan", "ghost"])
def test_nan_or_missing_series_are_no_data(prom, name):
    hw = hw_of(name, prom)
    assert hw["verdict"] == "no_data" and hw["gpus"] == []
    assert f"no series for the culprit GPUs ({name}-node-02) after the onset" in hw["summary"]
    assert "Hostname matching" in hw["summary"]


# ------------------------------------------------------------------------------ faults
def assert_one_line_unavailable(caplog, hw: dict, words: str) -> None:
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and words in lines[0] and "asked again next cycle" in lines[0], lines
    assert hw["verdict"] == "unavailable" and words in hw["summary"] and not hw["final"]


def test_a_server_that_does_not_answer_times_out_and_is_asked_again(prom, caplog):
    job = JOBS["thr"]
    inc = incident(job)
    os.kill(prom.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            check(job, DcgmPrometheus(prom.url, timeout_s=0.5), [inc])
        took = time.monotonic() - t0
    finally:
        os.kill(prom.proc.pid, signal.SIGCONT)
    assert took < 3
    assert_one_line_unavailable(caplog, inc.hardware, "answer within 0.5 s")
    check(job, DcgmPrometheus(prom.url), [inc])   # the next cycle: due again, and answered
    assert inc.hardware["verdict"] == "hardware_fault"


def test_an_answer_over_the_byte_limit_is_cut(prom, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hw = hw_of("thr", prom, max_bytes=64 << 10)
    assert_one_line_unavailable(caplog, hw, "over the limit of 65,536 bytes")


def test_nothing_listening(caplog):
    job = JOBS["thr"]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hw = check(job, DcgmPrometheus(f"http://127.0.0.1:{free_port()}"))[0].hardware
    assert_one_line_unavailable(caplog, hw, "cannot reach it")


class _Gateway(http.server.BaseHTTPRequestHandler):
    """A gateway in front of Prometheus that answers 503 (a status no real Prometheus gives on demand)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"status": "error", "errorType": "unavailable", "error": "upstream connect error"}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


def test_a_5xx_answer(caplog):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            hw = check(JOBS["thr"], DcgmPrometheus(f"http://127.0.0.1:{server.server_port}"))[0].hardware
    finally:
        server.shutdown()
        server.server_close()
    assert_one_line_unavailable(caplog, hw, "answered 503: upstream connect error")


def test_an_incident_checked_before_its_window_is_whole_is_checked_again(prom):
    job = JOBS["thr"]
    inc = incident(job)
    settings = HardwareSettings(refresh_s=0)
    check(job, DcgmPrometheus(prom.url), [inc], settings, now_ms=job.onset_ms + 120_000)
    assert inc.hardware["verdict"] in ("hardware_fault", "no_data") and not inc.hardware["final"]
    check(job, DcgmPrometheus(prom.url), [inc], settings)
    assert inc.hardware["verdict"] == "hardware_fault" and inc.hardware["final"]


# ------------------------------------------------------------------------------ the dashboard's panels
@pytest.mark.parametrize("name", ["thr", "new"])
def test_the_incident_dashboards_gpu_panels_draw_the_culprit_hosts_gpus(prom, name):
    """Each PromQL of the drill-down's GPU panels, ``$culprit_host`` filled as its variable does (the first
    host's short name), over the onset window: one series per GPU of that host, none of another."""
    from dashboards.incident import FIRST_HOST_SHORT, gpu_queries

    job = JOBS[name]
    host = re.match(FIRST_HOST_SHORT.strip("/"), ",".join(incident(job).hosts)).group(1)
    for title, expr in gpu_queries().items():
        body = bounded_get(f"{prom.url}/api/v1/query_range",
                           {"query": expr.replace("$culprit_host", host), "start": str(job.onset_ms / 1000),
                            "end": str(job.onset_ms / 1000 + 600), "step": "60"}, timeout_s=10, max_bytes=1 << 22)
        result = json.loads(body)["data"]["result"]
        assert sorted(s["metric"]["gpu"] for s in result) == ["0", "1", "2", "3"], title
        if "Hostname" in result[0]["metric"]:
            assert {s["metric"]["Hostname"].lower().split(".")[0] for s in result} == {f"{name}-node-02"}
        if title.startswith("clock-event"):
            want = 0x60 if name == "thr" else 0x80
            assert {float(s["values"][-1][1]) for s in result} == {want}


def test_many_hosts_are_asked_for_a_few_at_a_time_with_the_same_answer(prom, monkeypatch):
    from analyzer.read import dcgm_prometheus

    whole = hw_of("thr", prom)
    monkeypatch.setattr(dcgm_prometheus, "HOSTS_PER_QUERY", 1)   # 4 hosts: 4 queries
    split = hw_of("thr", prom)
    assert split["verdict"] == "hardware_fault" and split["peer_gpus"] == whole["peer_gpus"] == 12
    assert [g["samples"] for g in split["gpus"]] == [g["samples"] for g in whole["gpus"]]


def test_odd_labels_and_points_in_an_answer():
    """A ``gpu`` label that only looks like a number ("²") is no index; a point that is no number
    is refused naming its series; a series of no job host is left out."""
    from analyzer.read.gpu_samples import SourceUnavailable
    from rankscope.hostnames import HostIndex

    def answer(*series: dict) -> bytes:
        return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": list(series)}}).encode()

    def series(gpu: str, host: str = "n1", value: str = "1500") -> dict:
        return {"metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "gpu": gpu, "Hostname": host},
                "values": [[1700000000, value], [1700000030, value]]}

    src = DcgmPrometheus("http://prometheus:9090")
    idx = HostIndex(["n1"], {})
    got = src.parse(answer(series("²"), series("3"), series("1", host="elsewhere")), idx)
    assert sorted(got["gpu"].tolist()) == [-1, -1, 3, 3] and set(got["host"]) == {"n1"}
    with pytest.raises(SourceUnavailable, match="series 1: 'values' is not a list"):
        src.parse(answer(series("0"), series("1", value="fast")), idx)


def test_a_short_onset_window_is_asked_for_at_a_finer_step():
    """The step floor (30 s) never leaves an onset window with fewer samples than a signal needs."""
    from analyzer.read.dcgm_prometheus import MIN_STEP_S
    from analyzer.service.hardware_evidence import hardware_evidence

    for window, step in ((600.0, MIN_STEP_S), (60.0, 15.0)):
        settings = HardwareSettings(prometheus_url="http://prometheus:9090", window_s=window, gpu_health=False)
        (source,) = hardware_evidence(object(), settings, {}).sources
        assert source.min_step_s == step


def test_a_check_asks_for_its_signals_only_and_for_the_baseline_at_a_coarser_step(prom, monkeypatch):
    """A compute straggler's check reads no link counters; a link degradation's reads them (and
    finds the replays). Each asks for the baseline and the onset window apart, the baseline at
    about BASELINE_POINTS samples a series and of the culprit's host alone (the peers are
    compared after the onset), with no sample time asked for twice."""
    from analyzer.read import dcgm_prometheus
    from analyzer.read.dcgm_prometheus import BASELINE_POINTS, MIN_STEP_S

    asked: list[dict] = []

    def recording(url, params, **kw):
        asked.append(dict(params))
        return bounded_get(url, params, **kw)

    monkeypatch.setattr(dcgm_prometheus, "bounded_get", recording)
    job = JOBS["pcie"]
    compute = check(job, DcgmPrometheus(prom.url))[0].hardware
    compute_asked, asked[:] = list(asked), []
    link = check(job, DcgmPrometheus(prom.url), [incident(job, IncidentClass.LINK_DEGRADATION)])[0].hardware
    assert compute["verdict"] == "no_hardware_signal" and link["verdict"] == "hardware_fault"
    assert "pcie_replays" in signals(link)
    assert all("PCIE" not in a["query"] and "NVLINK" not in a["query"] for a in compute_asked)
    assert all("PCIE_REPLAY" in a["query"] and "SM_CLOCK" in a["query"] for a in asked)
    for queries in (compute_asked, asked):
        (base, window) = sorted(queries, key=lambda a: float(a["start"]))
        assert float(base["end"]) < job.onset_ms / 1000 == float(window["start"])
        assert float(window["step"]) == MIN_STEP_S
        assert float(base["step"]) == pytest.approx((float(base["end"]) - float(base["start"])) / BASELINE_POINTS, abs=1)
        culprit, peer = job.hosts()[job.culprit], job.hosts()[job.culprit - 1]
        names_base, names_window = (a["query"].replace("\\", "") for a in (base, window))   # names as regexes
        assert culprit in names_base and peer not in names_base, base["query"]
        assert culprit in names_window and peer in names_window, window["query"]


def test_a_label_that_is_no_text_is_refused_naming_its_series_and_the_collector_is_back_on():
    import gc

    from analyzer.read.gpu_samples import SourceUnavailable
    from rankscope.hostnames import HostIndex

    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "Hostname": "n1", "gpu": "0"}, "values": [[1, "2"]]},
        {"metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "Hostname": "n1", "gpu": 1}, "values": [[1, "2"]]}]}}).encode()
    with pytest.raises(SourceUnavailable, match="series 1: label 'gpu' is not a text"):
        DcgmPrometheus("http://prometheus:9090").parse(body, HostIndex(["n1"], {}))
    assert gc.isenabled()
