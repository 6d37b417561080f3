"""``rankscope import-ops``: the per-operation traces of three real jobs (StragglerAnalysis),
imported and diagnosed as their paper says (tests/data/stragglers/README.md)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("pyarrow")

from analyzer.service.run_once import run_once  # noqa: E402
from collector.ops_import import OPTYPE_STAGES, OpsError, layout, read_ops, stage_frame  # noqa: E402
from collector.stage_timer import MEGATRON_ALIASES  # noqa: E402
from rankscope.cli import main as cli_main  # noqa: E402
from rankscope.schema import KNOWN_STAGES  # noqa: E402

DATA = Path(__file__).parent / "data" / "stragglers"
#: (ranks per worker = tp x dsp, from meta-*.yaml)
RANKS_PER_WORKER = {"AR": 4, "ST": 1, "SE": 2}
START_MS = 1_780_000_000_000
#: Classes that name culprit ranks; SE, spread over every worker, has none of them.
CULPRIT_CLASSES = {"compute_straggler", "link_degradation", "host_stall", "transient_stall", "silent_rank"}


def trace(name: str) -> Path:
    return DATA / f"trace-{name}.parquet"


@pytest.fixture(scope="module")
def ops():
    return {name: read_ops(trace(name)) for name in RANKS_PER_WORKER}


def imported(store, ops, name: str, start_ms: int = START_MS) -> pd.DataFrame:
    frame, _ = stage_frame(ops[name], name, start_ms, ranks_per_worker=RANKS_PER_WORKER[name])
    store.write_stage_latency(frame)
    return frame


def describe(incidents: list[dict]) -> str:
    return "; ".join(f"{i['class']} ranks {i['ranks']} {i['stage']} x{i['ratio']}: "
                     f"{i['evidence'].get('summary', '')}" for i in incidents) or "no incident"


# ------------------------------------------------------------------------------ the importer
def test_vendored_slices_are_small_and_licensed():
    files = list(DATA.iterdir())
    assert sum(f.stat().st_size for f in files) < 2_000_000
    assert "Apache License" in (DATA / "LICENSE").read_text()
    notice = (DATA / "README.md").read_text()
    assert "ByteDance-Seed/StragglerAnalysis" in notice and "8efcd7f37f158af26ac64d0b6fbf1f22d28a6e83" in notice


def test_mapping_follows_megatron_aliases_and_stage_kinds():
    for op, stage in MEGATRON_ALIASES.items():
        if op in OPTYPE_STAGES:
            assert OPTYPE_STAGES[op] == stage, op
    for op, stage in OPTYPE_STAGES.items():
        if stage is None:
            continue
        kind = KNOWN_STAGES[stage].kind
        collective = any(w in op for w in ("send", "recv", "reduce", "gather", "clip"))
        assert kind == ("comm" if collective else "compute"), (op, stage, kind)
    assert KNOWN_STAGES["pp_send"].group == "pipeline" and KNOWN_STAGES["reduce_scatter"].group == "dp"


@pytest.mark.parametrize("name", ["AR", "ST", "SE"])
def test_layout_is_megatron_order_of_workers(ops, name):
    """A worker's trace rank is its first rank in the real job (tp-dp-pp order, TP/DSP inner)."""
    lay = layout(ops[name], RANKS_PER_WORKER[name])
    t = lay.topology
    np.testing.assert_array_equal(lay.trace_rank, np.arange(t.world) * RANKS_PER_WORKER[name])
    assert t.world * RANKS_PER_WORKER[name] == {"AR": 64, "ST": 8, "SE": 128}[name]
    assert t.gpus_per_node == 8 // RANKS_PER_WORKER[name]


def test_stage_frame_one_point_per_worker_per_step_with_its_own_clock(ops):
    o = ops["AR"]
    frame, lay = stage_frame(o, "AR", START_MS, ranks_per_worker=4)
    assert len(frame) == 16 * 20 and not frame.duplicated(["iteration", "rank"]).any()
    assert set(frame.columns) >= {"time", "job", "rank", "pp", "dp", "tp", "ep_group", "node", "iteration",
                                  "iteration_ms", "compute_other", "pp_send", "pp_recv", "reduce_scatter",
                                  "all_gather", "optimizer", "comm_other"}
    # worker 13 = stage 3, dp_rank 1 = trace rank 52, on node 6 (ranks 48-55 of the real job)
    row = frame[(frame["rank"] == 13) & (frame["iteration"] == 21)].iloc[0]
    assert (row["pp"], row["dp"], row["tp"], row["node"]) == (3, 1, 0, 6)
    mine = o[(o["rank"] == 52) & (o["step"] == 21)]
    comp = mine[mine["optype"].astype(str).isin(["forward-compute", "backward-compute"])]
    assert row["compute_other"] == pytest.approx(comp["duration"].astype(float).sum() * 1000, rel=1e-6)
    end = float((mine["start_ts"].astype(float) + mine["duration"].astype(float)).max())
    first = float(mine["start_ts"].astype(float).min())
    assert row["iteration_ms"] == pytest.approx((end - first) * 1000, rel=1e-6)
    # steps 47 s apart (the longest step, 46.9 s, in whole seconds), from START_MS at the first (16)
    assert row["time"] == pytest.approx(START_MS + (21 - 16) * 47_000 + end * 1000, abs=1)
    # each rank stamps its own end of the step: one step carries many distinct times
    assert frame.loc[frame["iteration"] == 21, "time"].nunique() > 1


# ------------------------------------------------------------------------------ the verdicts
def test_ar_names_the_injected_worker_only(embedded_store, ops):
    imported(embedded_store, ops, "AR")
    incidents = run_once(embedded_store, "AR")
    assert incidents, "no incident for the injected slow worker"
    # worker 0 = stage 0, dp_rank 0 = ranks 0-3 of the job (its TP group), on node 0
    assert all(i["ranks"] == [0] for i in incidents), describe(incidents)
    assert {i["class"] for i in incidents} == {"compute_straggler"}, describe(incidents)
    ev = incidents[0]["evidence"]
    assert ev["stage_kind"] == "compute" and ev["arrived_last"] is True, describe(incidents)


def test_ar_on_influxdb(influx_store, ops):
    start = (int(time.time() * 1000) - 12 * 3600_000) // 1000 * 1000
    frame = imported(influx_store, ops, "AR", start)
    back = influx_store.read_stage_latency("AR")
    assert len(back) == len(frame) and back["time"].nunique() == frame["time"].nunique()
    incidents = run_once(influx_store, "AR")
    assert incidents and all(i["ranks"] == [0] and i["class"] == "compute_straggler"
                             for i in incidents), describe(incidents)


def test_st_names_only_the_last_stage(embedded_store, ops):
    imported(embedded_store, ops, "ST")
    incidents = run_once(embedded_store, "ST")
    assert incidents, "nothing said about the long last stage"
    # the last pipeline stage is ranks 6 and 7 (stage 3, dp_rank 0 and 1)
    assert all(set(i["ranks"]) <= {6, 7} for i in incidents), describe(incidents)
    assert any(set(i["ranks"]) == {6, 7} for i in incidents), describe(incidents)


def test_st_is_a_pipeline_imbalance(embedded_store, ops):
    imported(embedded_store, ops, "ST")
    incidents = run_once(embedded_store, "ST")
    assert [(i["class"], i["ranks"]) for i in incidents] == [("pipeline_imbalance", [6, 7])], describe(incidents)


def test_se_has_no_culprit(embedded_store, ops):
    frame = imported(embedded_store, ops, "SE")
    assert frame["rank"].nunique() == 64
    incidents = run_once(embedded_store, "SE")
    culprits = [i for i in incidents if i["class"] in CULPRIT_CLASSES]
    assert not culprits, describe(culprits)
    # what the paper adds (a long last stage, second to the imbalance) may show, as a stage
    last = set(range(32, 64))
    assert all(i["class"] == "pipeline_imbalance" and set(i["ranks"]) <= last for i in incidents), \
        describe(incidents)


# ------------------------------------------------------------------------------ the command
def test_import_ops_cli(tmp_path, capsys):
    store = tmp_path / "s.db"
    rc = cli_main(["import-ops", str(trace("ST")), "--job", "st", "--store", str(store),
                   "--meta", str(DATA / "meta-ST.yaml"), "--start", "2026-07-08T09:30:00Z"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "imported 256 point(s): 8 worker(s) (pp 4 x dp 2, 1 rank(s) each, 8 per node), 32 step(s) 23-1048" \
        in out.out
    from rankscope.store import EmbeddedStore

    s = EmbeddedStore(store)
    try:
        df = s.read_stage_latency("st")
    finally:
        s.close()
    assert len(df) == 256 and df["time"].min() >= 1783503000000
    assert df["time"].min() < 1783503000000 + 3000


def test_import_ops_cli_meta_sets_ranks_per_worker(tmp_path, capsys):
    rc = cli_main(["import-ops", str(trace("AR")), "--job", "ar", "--store", str(tmp_path / "s.db"),
                   "--meta", str(DATA / "meta-AR.yaml")])
    out = capsys.readouterr().out
    assert rc == 0 and "16 worker(s) (pp 4 x dp 4, 4 rank(s) each, 2 per node)" in out


def error_of(capsys, *argv) -> str:
    assert cli_main(["import-ops", *map(str, argv)]) == 1
    return capsys.readouterr().err


def test_import_ops_cli_errors(tmp_path, capsys):
    store = tmp_path / "s.db"
    missing = tmp_path / "nope.parquet"
    assert f"{missing}: no such file" in error_of(capsys, missing, "--job", "x", "--store", store)
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    assert "junk.parquet: not a Parquet file" in error_of(capsys, junk, "--job", "x", "--store", store)
    assert "is a directory" in error_of(capsys, tmp_path, "--job", "x", "--store", store)
    # a meta that does not describe the trace
    err = error_of(capsys, trace("ST"), "--job", "x", "--store", store, "--meta", DATA / "meta-AR.yaml")
    assert "dp_size 4 (the trace has 2)" in err
    # TP4 workers do not fill nodes of 6 GPUs
    err = error_of(capsys, trace("ST"), "--job", "x", "--store", store, "--tp", "4", "--gpus-per-node", "6")
    assert "do not divide 6 GPUs per node" in err
    assert "--start" in error_of(capsys, trace("ST"), "--job", "x", "--store", store, "--start", "yesterday")
    assert not store.exists()   # every error came before the store was opened


def test_missing_columns_are_named(tmp_path, capsys, ops):
    bad = tmp_path / "bad.parquet"
    ops["ST"].drop(columns=["duration", "stage"]).to_parquet(bad)
    err = error_of(capsys, bad, "--job", "x", "--store", tmp_path / "s.db")
    assert "bad.parquet lacks column(s) stage, duration" in err


def test_csv_and_content_errors(tmp_path, ops):
    st = ops["ST"].copy()
    csv = tmp_path / "st.csv"
    st.to_csv(csv, index=False)
    frame, _ = stage_frame(read_ops(csv), "st", START_MS)
    want, _ = stage_frame(st, "st", START_MS)
    pd.testing.assert_frame_equal(frame, want, check_dtype=False)
    odd = st.copy()
    odd["optype"] = odd["optype"].astype(str).replace("optimizer", "adam-step")
    with pytest.raises(OpsError, match="unknown optype.s. adam-step"):
        stage_frame(odd, "st", START_MS)
    neg = st.copy()
    neg.loc[neg.index[5], "duration"] = -1.0
    with pytest.raises(OpsError, match="1 operation.s. with a missing, non-finite or negative"):
        stage_frame(neg, "st", START_MS)
    with pytest.raises(OpsError, match="records 7 worker.s., not every one of pp=4 x dp=2"):
        stage_frame(st[st["rank"] != 3], "st", START_MS)
    with pytest.raises(OpsError, match="no operation"):
        stage_frame(st.iloc[:0], "st", START_MS)


def test_host_pattern_names_the_host_to_drain(tmp_path, capsys):
    store = tmp_path / "s.db"
    rc = cli_main(["import-ops", str(trace("AR")), "--job", "ar", "--store", str(store), "--meta",
                   str(DATA / "meta-AR.yaml"), "--host-pattern", "gpu-node-{node:03d}"])
    assert rc == 0, capsys.readouterr().err
    from rankscope.store import EmbeddedStore

    s = EmbeddedStore(store)
    try:
        df = s.read_stage_latency("ar")
        # worker 1 (trace rank 4) holds GPUs 4-7 of node 0; worker 15 (rank 60) GPUs 4-7 of node 7
        tags = df.drop_duplicates("rank").set_index("rank")
        assert (tags.loc[1, "host"], int(tags.loc[1, "gpu"])) == ("gpu-node-000", 4)
        assert (tags.loc[15, "host"], int(tags.loc[15, "gpu"])) == ("gpu-node-007", 4)
        incidents = run_once(s, "ar")
    finally:
        s.close()
    assert [(i["ranks"], i["hosts"]) for i in incidents] == [([0], ["gpu-node-000"])], describe(incidents)
    assert "pattern" in error_of(capsys, trace("AR"), "--job", "x", "--store", tmp_path / "t.db",
                                 "--host-pattern", "gpu-node-{rank}")
