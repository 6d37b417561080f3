"""The service's decisions on a job's life (:class:`analyzer.service.job_life.JobLife`) and the
read's word on restarts (:meth:`IterationReader.restarted`), on the embedded store: a job that
ended gets no reader until it writes again, then one from its first point after the end with its
steps after the old job's; a new-job segment ends the old job once; a chunk read again after a
failed cycle is no second restart."""

from __future__ import annotations

import pandas as pd

from analyzer.read.attempts import SEGMENT, Attempts, Segment
from analyzer.read.iteration_reader import IterationReader
from analyzer.service.job_life import JobEnd, JobLife
from rankscope import schema
from rankscope.store import EmbeddedStore

T0 = 1_770_000_000_000


def _points(store: EmbeddedStore, job: str, times_ms: list[int]) -> None:
    store.write_stage_latency(pd.DataFrame({
        "time": times_ms, "job": job, "rank": "0", "host": "h0", schema.ITERATION_FIELD: range(len(times_ms)),
        schema.ITERATION_MS_FIELD: 1000.0, "stage_fwd_ms": 500.0}))


def _rows(segment: int) -> pd.DataFrame:
    return pd.DataFrame({SEGMENT: [segment, segment]})


def _make(store: EmbeddedStore, job: str, made: list[tuple]):
    def make(since_ms: int | None, base_step: int) -> IterationReader:
        made.append((since_ms, base_step))
        reader = IterationReader(store, job, since_ms=since_ms)
        reader.attempts = Attempts(job, base_step=base_step)
        return reader
    return make


def test_an_ended_job_gets_a_reader_only_from_its_first_point_after_the_end(tmp_path):
    with EmbeddedStore(tmp_path / "s.db") as store:
        _points(store, "j", [T0, T0 + 1000])
        life, made = JobLife(store), []
        assert life.reader("j", _make(store, "j", made)) is not None and made == [(None, 0)]
        life.released("j", JobEnd(T0 + 1000, 41))
        made.clear()
        assert life.reader("j", _make(store, "j", made)) is None and "j" in life.ended
        _points(store, "j", [T0 + 900_000])
        reader = life.reader("j", _make(store, "j", made))
        assert reader is not None and made[-1] == (T0 + 900_000, 42) and "j" not in life.ended
        assert reader.attempts.segments[0].first_step == 42


def test_a_stored_end_is_an_end_for_a_fresh_service(tmp_path):
    with EmbeddedStore(tmp_path / "s.db") as store:
        _points(store, "j", [T0])
        store.write_measurement(schema.JOB_LIFECYCLE, pd.DataFrame([{
            "time": T0, "job": "j", "event": "ended", "attempt": 0, schema.ITERATION_FIELD: 0, "step": 7,
            "ranks": 1, "text": "job ended"}]))
        assert JobLife(store).reader("j", _make(store, "j", [])) is None


def test_a_new_job_segment_ends_the_old_job_once(tmp_path):
    with EmbeddedStore(tmp_path / "s.db") as store:
        reader = IterationReader(store, "j")
        reader.attempts.segments = [Segment("start", T0, 0, 0, 0), Segment("restart", T0 + 1, 5, 5, 1),
                                    Segment("start", T0 + 2, 0, 9, 0)]
        life = JobLife(store)
        assert not life.new_job_at("j", reader, _rows(1))   # a restart is no new job
        assert life.new_job_at("j", reader, _rows(2))
        assert not life.new_job_at("j", reader, _rows(2))   # the same segment handed on again
        assert not life.new_job_at("j", reader, pd.DataFrame({"x": [1]}))   # rows of no segment


def test_a_chunk_of_a_later_segment_is_a_restart_once(tmp_path):
    with EmbeddedStore(tmp_path / "s.db") as store:
        reader = IterationReader(store, "j")
        assert [reader.restarted(_rows(k)) for k in (0, 0, 1, 1, 0, 1, 2)] == \
            [False, False, True, False, False, False, True]
