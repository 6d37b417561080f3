"""Hardware evidence from Telegraf's ``nvidia_smi`` input in a real InfluxDB (Debian's 1.6): points as
Telegraf writes them (measurement ``nvidia_smi``, tags ``host`` (the short name), ``index``, ``uuid``,
``name``; integer fields ``clocks_current_sm``, ``temperature_gpu``, ``utilization_gpu``, float
``power_draw``) in a database of their own on the store's server, read by
:class:`~analyzer.read.telegraf_nvidia_smi.TelegrafNvidiaSmi` through the real
:class:`~analyzer.service.hardware_evidence.HardwareEvidence`.

Telegraf reports no clock-event reasons: a throttling GPU shows in its temperature, clock and power.
A database without the measurement, a database that does not exist and a server that does not
answer are ``no_data``, ``no_data`` and ``unavailable``, each with its reason."""

from __future__ import annotations

import logging
import time
import uuid
import zlib

import numpy as np
import pytest

from analyzer.read.telegraf_nvidia_smi import TelegrafNvidiaSmi
from rankscope.store import InfluxStore
from tests.dcgm_series import Job, levels, sample_times
from tests.hardware_incidents import check, signals
from tests.influx_server import free_port

ONSET_MS = (int(time.time() * 1000) - 2 * 3600_000) // 60_000 * 60_000
THERMAL = Job("tg", "thermal", ONSET_MS, full_names=True)
CLEAN = Job("tgc", "clean", ONSET_MS, full_names=True)
LOGGER = "analyzer.service.hardware_evidence"


def telegraf_lines(job: Job) -> list[str]:
    """``nvidia_smi`` line protocol of ``job``'s GPUs, ``host`` the short name as Telegraf's agent has it."""
    t = sample_times(job)
    rng = np.random.default_rng(zlib.crc32(job.name.encode()))
    out = []
    for node, host in enumerate(job.hosts()):
        for gpu in range(job.gpus):
            v = levels(job, node == job.culprit, t, rng)
            for k, ts in enumerate(t):
                out.append(f"nvidia_smi,host={host.split('.')[0]},index={gpu},uuid={job.uuid(node, gpu)},"
                           f"name=NVIDIA\\ H100\\ 80GB\\ HBM3,pstate=P0 "
                           f"clocks_current_sm={round(v['DCGM_FI_DEV_SM_CLOCK'][k])}i,"
                           f"temperature_gpu={round(v['DCGM_FI_DEV_GPU_TEMP'][k])}i,"
                           f"power_draw={v['DCGM_FI_DEV_POWER_USAGE'][k]:.2f},utilization_gpu=100i {int(ts)}")
    return out


@pytest.fixture(scope="module")
def telegraf_db(influx_url):
    """A ``telegraf_*`` database holding both jobs' points, and one holding another measurement only."""
    dbs = [InfluxStore(influx_url, bucket=f"telegraf_{uuid.uuid4().hex[:8]}", api="v1") for _ in range(2)]
    try:
        dbs[0].write_lines(telegraf_lines(THERMAL) + telegraf_lines(CLEAN))
        dbs[1].write_lines([f"cpu,host=tg-node-02 usage_idle=99.0 {ONSET_MS}"])
        yield influx_url, dbs[0].bucket, dbs[1].bucket
    finally:
        for db in dbs:
            db.drop_database()
            db.close()


def test_a_throttling_gpu_from_its_temperature_clock_and_power(telegraf_db):
    url, db, _ = telegraf_db
    hw = check(THERMAL, TelegrafNvidiaSmi(url, db))[0].hardware
    assert hw["verdict"] == "hardware_fault" and hw["source"] == "nvidia_smi" and hw["final"]
    assert signals(hw) == {"temperature_c", "sm_clock_mhz", "power_w"}
    assert hw["phrase"] == "GPU thermal throttling" and hw["peer_gpus"] == 12
    g = hw["gpus"][0]
    assert g["host"] == "tg-node-02.dc1.example.com" and g["gpu"] == 0
    assert g["temperature_c"]["after"] > 85 and g["temperature_c"]["peers"] < 70
    assert g["sm_clock_mhz"]["after"] < 0.7 * g["sm_clock_mhz"]["before"]


def test_a_slow_gpu_with_clean_telemetry(telegraf_db):
    url, db, _ = telegraf_db
    hw = check(CLEAN, TelegrafNvidiaSmi(url, db))[0].hardware
    assert hw["verdict"] == "no_hardware_signal" and signals(hw) == set() and len(hw["gpus"]) == 4


def test_a_database_without_the_measurement_is_no_data(telegraf_db):
    url, _, other = telegraf_db
    hw = check(THERMAL, TelegrafNvidiaSmi(url, other))[0].hardware
    assert hw["verdict"] == "no_data" and f"measurement nvidia_smi in database {other}" in hw["summary"]
    hw = check(THERMAL, TelegrafNvidiaSmi(url, "no_such_db"))[0].hardware
    assert hw["verdict"] == "no_data" and "no database no_such_db" in hw["summary"]


def test_an_influxdb_that_does_not_answer(caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        hw = check(THERMAL, TelegrafNvidiaSmi(f"http://127.0.0.1:{free_port()}", "telegraf", timeout_s=1))[0].hardware
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and "InfluxDB" in lines[0] and "cannot reach it" in lines[0]
    assert hw["verdict"] == "unavailable" and "tried again next cycle" in hw["summary"]
