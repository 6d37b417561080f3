"""Foundation: line-protocol encoder vs influxdb-client's DataFrame serializer; topology build."""

from __future__ import annotations

import numpy as np
import pandas as pd

from rankscope import schema
from rankscope.frames import cube_to_frame
from rankscope.lineprotocol import encode_frame, encode_lines, encode_prefixes
from rankscope.topology import GROUP_KINDS, Topology

IL = Topology(tp=1, pp=9, dp=1440, ep=32, gpus_per_node=8, host_pattern="gpu-node-{node:05d}")
STAGES = schema.DEFAULT_STAGES.names


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    # collectors write durations at 1 us resolution (3 decimals of a ms)
    values = np.round(rng.uniform(1, 300, size=(IL.world, len(STAGES))), 3)
    return cube_to_frame("il-0477", IL, 7, 1_700_000_000_000, values, STAGES, np.round(values.sum(axis=1), 3))


def _client_lines(df: pd.DataFrame) -> list[str]:
    from influxdb_client import WritePrecision
    from influxdb_client.client.write.dataframe_serializer import data_frame_to_list_of_points

    frame = df.copy()
    frame.index = pd.to_datetime(frame["time"], unit="ms", utc=True)
    frame = frame.drop(columns=["time"])
    tags = list(schema.RANK_TAGS)
    return data_frame_to_list_of_points(
        frame, point_settings=_settings(), precision=WritePrecision.MS,
        data_frame_measurement_name=schema.STAGE_LATENCY, data_frame_tag_columns=tags)


def _settings():
    from influxdb_client.client.write_api import PointSettings
    return PointSettings()


def _parse(line: str) -> tuple[str, dict[str, str], str]:
    head, fields, ts = line.rsplit(" ", 2)
    kv = dict(p.split("=", 1) for p in fields.split(","))
    return head, {k: float(v.rstrip("i")) for k, v in kv.items()}, ts


def run(ctx) -> str:
    df = _frame()
    tags = list(schema.RANK_TAGS)
    fields = [schema.ITERATION_FIELD, schema.ITERATION_MS_FIELD, *STAGES]
    prefixes = encode_prefixes(schema.STAGE_LATENCY, df[tags])
    cols = {f: df[f].to_numpy() for f in fields}
    times = df["time"].to_numpy()

    ours = encode_frame(schema.STAGE_LATENCY, df, tags, fields)
    theirs = _client_lines(df)
    # identical up to field order / float formatting: same measurement+tags, same values, same time
    same = len(ours) == len(theirs) and all(_parse(a) == _parse(b) for a, b in zip(ours, theirs, strict=True))

    t = ctx.side_by_side({
        "influxdb-client DataFrame serializer": lambda: _client_lines(df),
        "rankscope encode_frame (tags encoded per call)": lambda: encode_frame(schema.STAGE_LATENCY, df, tags, fields),
        "rankscope encode_lines (cached rank prefixes)": lambda: encode_lines(prefixes, cols, times),
    })
    base = t["influxdb-client DataFrame serializer"]
    rows = "\n".join(f"| {k} | {v * 1000:.1f} ms | {base / v:.1f}x |" for k, v in t.items())

    topo_s = ctx.median_s(lambda: _build(100_000), repeat=ctx.repeat)
    topo_il = ctx.median_s(lambda: _build(12_960), repeat=ctx.repeat)
    return f"""## Foundation

### Line protocol: one IL-0477 iteration (12,960 points x {len(STAGES)} stage fields + iteration, iteration_ms)

| encoder | median | speed-up vs influxdb-client |
|---|---|---|
{rows}

Output identical to influxdb-client's (same measurement and tag set, same field values parsed back, same timestamp, on every one of the 12,960 lines): **{same}**. Target: at least 5x faster.

### Topology: build every group of every kind (ids and member matrices)

| world | median |
|---|---|
| 12,960 (IL-0477: tp=1 pp=9 dp=1440 ep=32) | {topo_il * 1000:.1f} ms |
| 100,000 (tp=8 pp=10 dp=1250 ep=25) | {topo_s * 1000:.1f} ms |
"""


def _build(world: int) -> None:
    t = IL if world == 12_960 else Topology(tp=8, pp=10, dp=1250, ep=25, gpus_per_node=8)
    t = Topology(**t.to_dict())
    for kind in GROUP_KINDS:
        t.members(kind)
