"""Rule: a straggler named from communication alone, by who arrives last.

Every member of a collective finishes it together, so its measured time is the wait for the
last member to arrive plus the transfer: the rank that arrives last measures the *shortest*
time, its group-mates the longest. A job whose collector writes only collective timings
(``rankscope import-nccl``: NCCL Inspector, Flight Recorder) has no compute stage in which a
slow rank would stand out; this rule names it from the shape of the waits instead.

A rank is *short* in a communication stage when its time, smoothed over ``smooth``
iterations, is below ``arrival_short_ratio`` of its collective group's median and at least
``arrival_min_gap_ms`` shorter, while that group's median has risen to more than
``arrival_rise`` times its level before (a slow moving baseline of the group median the rank
sees, weight ``arrival_baseline_alpha``, updated while the rank is not flagged; these are
settings of :class:`~analyzer.config.AnalyzerConfig`). A rank short in most (more than half,
at least one) of the stages whose group rose is flagged; flagged for more than ``transient_max``
iterations in a row, it is an :attr:`~rankscope.incident.IncidentClass.ARRIVAL_STRAGGLER`.
A rank that merely waits for the straggler in another group (its pipeline partner, say)
is short in that group's stage too, but long in the stages it shares with the straggler:
it is not short in most of them.

**Clocks.** Times imported from arrival stamps (Flight Recorder without durations: each
rank's wait for the last member, ``rankscope import-nccl``) compare clocks across hosts, which
agree only within their skew, bounded by ``arrival_clock_skew_ms``: in a group that spans
hosts a rank is short only by more than that bound (and ``arrival_min_gap_ms``), and the
verdict says that the skew bounds how finely arrival is resolved there. (Durations measured
by each rank, as NCCL Inspector's, compare no clocks; the bound then only adds to the gap.)

The rule runs only on iterations with no compute or host stage reported (where those exist,
the straggler rule names the slow stage itself) and skips ranks an open incident of another
rule holds. Vectorised over ranks and stages.
"""

from __future__ import annotations

import warnings

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.detect.group_scores import group_medians, mates_medians
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.inner_groups import Descent, descend, note_descent
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_evidence import split_by_onset_and_place
from analyzer.diagnosis.rule import Rule, culprit_incident, set_culprits
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks, rank_phrase

#: A group's median rose only beyond this many sigmas of its own swings (as its baseline learned them).
NOISE_Z = 3.0


class ArrivalRule(Rule):
    """Ranks whose collectives are consistently the shortest of their groups while those rose."""

    classes = (IncidentClass.ARRIVAL_STRAGGLER,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig):
        super().__init__(job, topo, stages, cfg)
        self.comm = np.array([st.kind == "comm" and topo.group_size(st.group) > 1 for st in stages])
        self.cause = np.array([st.kind in ("compute", "host") for st in stages])
        n, s = topo.world, len(stages)
        self.base = np.full((n, s), np.nan)     # baseline of the median of each rank's group-mates
        self.streak = np.zeros(n, dtype=np.int64)
        self.onset = np.zeros(n, dtype=np.int64)
        self.flagged = np.zeros(n, dtype=bool)
        self.held = np.zeros(n, dtype=bool)      # culprits of this rule's open incidents
        self.var = np.zeros((n, s))             # ... its variance
        self.own = np.full((n, s), np.nan)      # ... and of its own time
        self.ratios = np.full((cfg.smooth, 2, n, int(self.comm.sum())), np.nan)   # each rank's last ratios
        self.t = 0
        self._spans: tuple[Topology, np.ndarray] | None = None

    def _medians(self, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per comm stage ``[R, S_comm]``: the median of the collective group each rank is in (its
        collective got longer when it rose), and the median of the rank's group-mates (in a group
        of two its partner), against which it is short (a group of waits may have a median of 0,
        where a ratio to it says nothing)."""
        cols = np.flatnonzero(self.comm)
        med, mates = np.full((self.topo.world, len(cols)), np.nan), np.full((self.topo.world, len(cols)), np.nan)
        for kind in {self.stages.stages[int(j)].group for j in cols}:
            mine = np.array([self.stages.stages[int(j)].group == kind for j in cols])
            members, gid = self.topo.members(kind), self.topo.group_ids(kind)
            med[:, mine] = group_medians(vals[:, cols[mine]], members)[gid]
            mates[:, mine] = mates_medians(vals[:, cols[mine]], members, gid)
        return med, mates

    def spans_hosts(self) -> np.ndarray:
        """``[R, S_comm]``: the rank's collective group in that stage spans several nodes (its
        members' clocks are different clocks); cached per topology."""
        if self._spans is None or self._spans[0] is not self.topo:
            cols = np.flatnonzero(self.comm)
            out = np.zeros((self.topo.world, len(cols)), dtype=bool)
            for i, j in enumerate(cols):
                kind = self.stages.stages[int(j)].group
                nodes = self.topo.node_index[self.topo.members(kind)]
                out[:, i] = (nodes.min(axis=1) != nodes.max(axis=1))[self.topo.group_ids(kind)]
            self._spans = (self.topo, out)
        return self._spans[1]

    def _flag(self, obs: Observation) -> np.ndarray:
        """Ranks short in most of their risen comm stages this iteration (updates the baseline)."""
        n = self.topo.world
        if not self.comm.any() or not len(obs.window):
            return np.zeros(n, dtype=bool)
        vals = obs.window.recent(1)[0]                                    # [R, S]
        if self.cause.any() and np.isfinite(vals[:, self.cause]).any():
            return np.zeros(n, dtype=bool)   # compute/host stages reported: the straggler rule's job
        c, cfg = self.comm, self.cfg
        alpha = cfg.arrival_baseline_alpha
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            v = vals[:, c]
            mates = self._medians(vals)[1]                      # the median of the rank's group-mates
            base, own = self.base[:, c], self.own[:, c]
            to_mates, to_own = self._smoothed(v / mates, v / own)
            valid = np.isfinite(v) & np.isfinite(mates) & (mates > 0)
            # across hosts, a lead within the clocks' skew is no lead
            gap = np.where(self.spans_hosts(), max(cfg.arrival_min_gap_ms, cfg.arrival_clock_skew_ms),
                           cfg.arrival_min_gap_ms)
            # its mates wait longer: beyond the rise, and beyond 3 sigmas of their median's own
            # swings (the waits of small collectives swing a lot)
            rose = (valid & np.isfinite(base) & (mates > cfg.arrival_rise * base)
                    & (mates - base > NOISE_Z * np.sqrt(self.var[:, c])))
            waits = np.isfinite(own) & (to_own > cfg.arrival_rise) & (v - own > gap)   # ... or it does
            calm = 1.0 + 0.5 * (cfg.arrival_rise - 1.0)
            # short: well under its mates', or its own time as it was while theirs rose
            short = (rose & ~waits & (mates - v > gap)
                     & ((to_mates < cfg.arrival_short_ratio) | (to_own < calm)))
            n_rose, n_short = (rose | waits).sum(axis=1), short.sum(axis=1)
            # and ahead of 2 other ranks at least: in a pair, which one is late is a coin toss
            flag = (n_short >= 1) & (2 * n_short > n_rose) & (self._mates_behind(short) >= 2)
            # the baselines follow what the rank sees while it is neither flagged nor short anywhere
            # (a rise in the making, before the flag's smoothing, is not learned)
            quiet = ~(flag | short.any(axis=1))[:, None]
            learn = valid & quiet
            dev = np.nan_to_num(mates - base)
            self.var[:, c] = np.where(learn & np.isfinite(base), (1 - alpha) * (self.var[:, c] + alpha * dev * dev),
                                      self.var[:, c])
            base = np.where(learn, _ewma(base, mates, alpha), base)
            own = np.where(np.isfinite(v) & quiet & ~waits, _ewma(own, v, alpha), own)
        self.base[:, c], self.own[:, c] = base, own
        return flag & obs.present

    def _mates_behind(self, short: np.ndarray) -> np.ndarray:
        """Per rank, how many group-mates the collectives it is short in hold (each group kind
        counted once: ``pp_send`` and ``pp_recv`` have the same partner)."""
        kinds = [self.stages.stages[int(j)].group for j in np.flatnonzero(self.comm)]
        out = np.zeros(short.shape[0], dtype=np.int64)
        for kind in set(kinds):
            cols = [i for i, k in enumerate(kinds) if k == kind]
            out += short[:, cols].any(axis=1) * (self.topo.group_size(kind) - 1)
        return out

    def _smoothed(self, to_mates: np.ndarray, to_own: np.ndarray) -> np.ndarray:
        """The medians of each rank's last ``smooth`` ratios to its group-mates' time and to its
        own baseline (this iteration's included), ``[2, R, S_comm]``."""
        self.ratios[self.t % self.ratios.shape[0]] = (to_mates, to_own)
        self.t += 1
        return np.nanmedian(self.ratios[:min(self.t, self.ratios.shape[0])], axis=0)

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        flag = self._flag(obs)
        start = flag & ~self.flagged
        self.onset[start] = obs.iteration
        self.streak = np.where(flag, self.streak + 1, 0)
        self.flagged = flag
        others = np.zeros(self.topo.world, dtype=bool)
        for inc in book.open():
            if inc.cls != IncidentClass.ARRIVAL_STRAGGLER:
                r = np.asarray(inc.ranks, dtype=np.int64)
                others[r[(r >= 0) & (r < self.topo.world)]] = True   # a rank the job no longer has: none
        confirmed = flag & (self.streak > self.cfg.transient_max) & ~self.held & ~others
        if not confirmed.any():
            return []
        ranks = np.flatnonzero(confirmed)
        out: list[Incident] = []
        for inc in book.open():   # ranks next to an open incident of this rule join it
            if inc.cls != IncidentClass.ARRIVAL_STRAGGLER:
                continue
            waited = np.isin(ranks, inc.waiting_ranks)   # they wait for its culprit: held, not named
            self.held[ranks[waited]] = True
            ranks = ranks[~waited]
            join = np.isin(self.topo.node_index[ranks], inc.nodes)
            if join.any():
                set_culprits(inc, np.union1d(inc.ranks, ranks[join]), self.topo)
                self.held[ranks[join]] = True
                self._evidence(inc, obs)
                out.append(inc)
                ranks = ranks[~join]
        if not len(ranks):
            return out
        gap = self.cfg.transient_max + 1
        for part, onsets in split_by_onset_and_place(ranks, self.onset[ranks], gap, self.topo):
            onset = int(onsets.min())
            d = self._descend(part, onset, obs)   # a TP group late together: the one its mates waited for
            inc = culprit_incident(self.job, IncidentClass.ARRIVAL_STRAGGLER, d.ranks, self.topo, onset,
                                   obs.window.time_of(onset, obs.time_ms), stage=None, ratio=1.0,
                                   group_type=None, group_ranks=[])
            self.held[np.union1d(part, d.ranks)] = True
            self._evidence(inc, obs)
            note_descent(inc, d)
            book.judge_events(inc, obs.window)
            out.append(book.register(inc))
        return out

    def _descend(self, ranks: np.ndarray, onset: int, obs: Observation) -> Descent:
        """:func:`~analyzer.diagnosis.inner_groups.descend` with each rank's excess its lead in the
        collectives (how much later it arrives than its group's median, at its most)."""
        win = obs.window
        now, before = win.values[win.since(onset)], win.values[win.before(onset)]
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            level = np.nanmedian(now, axis=0)
            lead = self._medians(level)[1] - level[:, self.comm]
            excess = np.nanmax(np.where(np.isfinite(lead), lead, -np.inf), axis=1)
        return descend(ranks, now, before, np.where(np.isfinite(excess), excess, np.nan), self.topo,
                       self.stages, self.cfg)

    def _collectives(self, ranks: np.ndarray, now: np.ndarray, before: np.ndarray) -> list[dict]:
        """Per comm stage the culprits' median time against their group-mates', now and before
        the onset, and whether the group spans hosts."""
        rows = []
        spans = self.spans_hosts()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for k, j in enumerate(np.flatnonzero(self.comm)):
                st = self.stages.stages[int(j)]
                groups = np.unique(self.topo.group_ids(st.group)[ranks])
                members = self.topo.members(st.group)[groups].reshape(-1)
                mates = np.setdiff1d(members, ranks)
                c_ms = float(np.nanmedian(now[:, ranks, j])) if len(now) else float("nan")
                m_ms = float(np.nanmedian(now[:, mates, j])) if len(now) and len(mates) else float("nan")
                m_before = float(np.nanmedian(before[:, mates, j])) if len(before) and len(mates) else float("nan")
                if not (np.isfinite(c_ms) and np.isfinite(m_ms)):
                    continue
                rows.append({"stage": st.name, "group": st.group, "group_ranks": format_ranks(members),
                             "culprit_ms": round(c_ms, 3), "groupmates_ms": round(m_ms, 3),
                             "groupmates_before_ms": round(m_before, 3),
                             "culprits_short": bool(c_ms < self.cfg.arrival_short_ratio * m_ms),
                             "across_hosts": bool(spans[ranks, k].any())})
        return rows

    def _evidence(self, inc: Incident, obs: Observation) -> None:
        """Per comm stage the culprits' time against their group-mates', now and before the onset."""
        win = obs.window
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        now, before = win.values[win.since(inc.onset_iteration)], win.values[win.before(inc.onset_iteration)]
        rows = self._collectives(ranks, now, before)
        shorts = [r for r in rows if r["culprits_short"]]
        best = max(shorts, key=lambda r: r["groupmates_ms"] - r["culprit_ms"]) if shorts else (rows[0] if rows else {
            "stage": "?", "group": "?", "group_ranks": "", "culprit_ms": float("nan"),
            "groupmates_ms": float("nan"), "groupmates_before_ms": float("nan"), "across_hosts": False})
        short = [r["stage"] for r in shorts]
        # how much the culprits stretch their group's collectives; their own time is a wait, and
        # timed by arrival every wait is near 0 before the onset too: no ratio then (the title
        # gives the lead in ms instead)
        before_ms = best["groupmates_before_ms"]
        ratio = best["groupmates_ms"] / before_ms if before_ms >= 1.0 else float("nan")
        inc.stage, inc.ratio = best["stage"], round(float(ratio), 3) if np.isfinite(ratio) else 1.0
        inc.group_type, inc.group_ranks = best["group"], [int(r) for r in np.sort(
            self.topo.members(best["group"])[np.unique(self.topo.group_ids(best["group"])[ranks])].reshape(-1))] \
            if best["group"] != "?" else []
        one = len(ranks) == 1
        summary = (f"From communication alone: {rank_phrase(inc.ranks, capital=False)} ({inc.where}) "
                   f"{'arrives' if one else 'arrive'} last. {'Its' if one else 'Their'} own collectives are "
                   f"the shortest of {'its' if one else 'their'} groups in {len(short)} of {len(rows)} "
                   f"communication stage(s) ({', '.join(short)}): {best['stage']} {best['culprit_ms']:.1f} ms "
                   f"vs {best['groupmates_ms']:.1f} ms for the group-mates ({best['group_ranks']}), who took "
                   f"{best['groupmates_before_ms']:.1f} ms before iteration {inc.onset_iteration}. The others "
                   f"wait for {'it' if one else 'them'} in every collective, so the slowness is on "
                   f"{'its' if one else 'their'} side before the collectives (compute, host or the GPU), not in "
                   f"the network; no compute stage is recorded to say which.")
        clocks = self._clocks(inc, best)
        if obs.l1_step:
            summary += (f" Job iteration time {obs.l1_step['before_ms'] / 1000:.2f} s -> "
                        f"{obs.l1_step['after_ms'] / 1000:.2f} s at iteration {obs.l1_step['iteration']}.")
        inner = inc.evidence.get("inner")   # a descent into inner groups stays
        inc.evidence = {"summary": summary + clocks.pop("sentence", ""), "stage": inc.stage, "stage_kind": "comm",
                        "ratio": inc.ratio, "arrived_last": True, "from_communication_alone": True,
                        "lead_ms": round(float(best["groupmates_ms"] - best["culprit_ms"]), 3),
                        "collectives": rows, "short_stages": short, "l1": obs.l1_step, **clocks,
                        **({"inner": inner} if inner else {})}

    def _clocks(self, inc: Incident, best: dict) -> dict:
        """Where the culprits' group spans hosts: the clock-skew bound on the resolution, for the
        evidence (``sentence`` for the summary)."""
        if not best.get("across_hosts"):
            return {}
        skew = self.cfg.arrival_clock_skew_ms
        lead = best["groupmates_ms"] - best["culprit_ms"]
        hosts = self.topo.hosts_of(np.asarray(inc.group_ranks, dtype=np.int64))
        names = ", ".join(sorted(set(hosts))) if hosts else "several nodes"
        return {"clock_skew_ms": skew, "sentence": (
            f" The group spans hosts ({names}), whose clocks agree only within {skew:g} ms "
            f"(arrival_clock_skew_ms): where these times are waits from arrival stamps (Flight Recorder "
            f"without durations), that skew bounds how finely arrival is resolved across hosts, and a "
            f"lead within it blames nobody; this lead is {lead:.1f} ms.")}

    def active(self, inc: Incident, obs: Observation) -> bool:
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        reporting = obs.present[ranks]
        if not reporting.any():
            return True
        return bool(self.flagged[ranks[reporting]].mean() >= 0.5)

    def resolved(self, inc: Incident) -> None:
        self.held[np.union1d(inc.ranks, inc.waiting_ranks).astype(np.int64)] = False

    def adopt(self, inc: Incident) -> None:
        self.held[np.union1d(inc.ranks, inc.waiting_ranks).astype(np.int64)] = True


def _ewma(base: np.ndarray, x: np.ndarray, alpha: float) -> np.ndarray:
    """``base`` moved towards ``x`` by ``alpha`` (``x`` where there is no base yet)."""
    return np.where(np.isfinite(base), (1 - alpha) * base + alpha * x, x)
