"""Diagnosis: from per-iteration L2 signals to incidents with culprits, class and evidence.

It sees through propagation. Collective times are symptoms (they are mostly
waiting), so only compute and host stages can name a culprit rank: a rank
whose compute is slow against its peers while its own collectives are SHORT
(it arrived last; everybody else waited for it). A degraded link shows in
no compute stage; it raises the *floor* of every collective group the ranks
behind it take part in, and the culprits are at the intersection of those
groups. A whole PP stage computing more than it used to is a pipeline
imbalance; a rank that stops reporting is silent.

Rules (thresholds in :class:`~analyzer.config.AnalyzerConfig`):

- a (rank, stage) hot for more than ``transient_max`` iterations in a row is
  confirmed: a compute straggler (compute stage) or a host stall (host stage);
  ranks confirmed together (close onsets, same class) form one incident;
- a hot streak of at most ``transient_max`` iterations that ends, having been at
  least ``abs_ratio`` and ``transient_z`` noise sigmas out, is a transient stall
  (written already resolved);
- floors risen for more than ``transient_max`` iterations at a stable
  intersection, without compute culprits there, is a link degradation;
- DP groups (PP stages) hot against their own past: pipeline imbalance;
- missing for ``silent_after`` iterations while most ranks report: silent rank;
- an incident resolves after ``resolve_after`` iterations with its culprits quiet.

State lives in the object; :meth:`Diagnoser.update` is fed once per iteration.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.events import category, verdict
from analyzer.floors import FloorScores, intersect_risen
from analyzer.group_scores import group_medians
from analyzer.incidents import EventVerdict, Incident, incident_id
from analyzer.rank_scores import RankScores, peer_kind
from analyzer.window import Window
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks

#: Group kinds that can localise a compute culprit, smallest first (pipeline
#: members do different work, so they are not peers).
_LOCAL_KINDS = ("tp", "node", "ep", "dp")


@dataclass
class _Episode:
    """A non-rank signal being confirmed (link floors, pipeline stages)."""

    ranks: np.ndarray
    stage: str | None
    ratio: float
    onset: int
    onset_ms: int
    streak: int = 1
    hits: dict[int, int] | None = None

    def count(self, ranks: np.ndarray) -> None:
        """Tally the ranks implicated this iteration."""
        if self.hits is None:
            self.hits = {}
        for r in ranks.tolist():
            self.hits[r] = self.hits.get(r, 0) + 1

    def steady(self) -> np.ndarray:
        """Ranks implicated in at least half of the episode's iterations."""
        if not self.hits:
            return self.ranks
        return np.array(sorted(r for r, n in self.hits.items() if n * 2 >= self.streak), dtype=np.int64)


class Diagnoser:
    """Turns each iteration's scores into incident updates for one job."""

    def __init__(self, job: str, topo: Topology, stages: StageSet, config: AnalyzerConfig | None = None):
        self.job, self.topo, self.stages = job, topo, stages
        self.cfg = config or AnalyzerConfig()
        n, s = topo.world, len(stages)
        self.kind = [st.kind for st in stages]
        self.streak = np.zeros((n, s), dtype=np.int64)
        self.onset = np.zeros((n, s), dtype=np.int64)
        self.peak = np.ones((n, s))
        self.peak_z = np.zeros((n, s))
        self.assigned = np.zeros((n, s), dtype=bool)
        self.seen = np.zeros(n, dtype=bool)
        self.missing = np.zeros(n, dtype=np.int64)
        self.missing_since = np.zeros(n, dtype=np.int64)
        self.incidents: list[Incident] = []
        self.quiet: dict[str, int] = {}
        self.link: _Episode | None = None
        self.balance: _Episode | None = None
        self.events: list[dict] = []
        self.last_step: dict | None = None

    # ------------------------------------------------------------ helpers
    def open_incidents(self) -> list[Incident]:
        return [i for i in self.incidents if i.status == "open"]

    def adopt(self, incidents: list[Incident]) -> None:
        """Take over incidents read back from the store (after a restart)."""
        known = {i.id for i in self.incidents}
        for inc in incidents:
            if inc.id in known:
                continue
            self.incidents.append(inc)
            if inc.status == "open" and inc.stage in self.stages and inc.cls in ("compute_straggler", "host_stall"):
                self.assigned[np.asarray(inc.ranks, dtype=np.int64), self.stages.index(inc.stage)] = True

    def _register(self, inc: Incident) -> Incident:
        """Add a new incident; one found again under the same id (after a restart) replaces it in place."""
        for i, old in enumerate(self.incidents):
            if old.id == inc.id:
                self.incidents[i] = inc
                return inc
        self.incidents.append(inc)
        return inc

    def add_events(self, events: list[dict]) -> None:
        seen = {(e["time"], e["name"], e["node"]) for e in self.events}
        self.events += [e for e in events if (e["time"], e["name"], e["node"]) not in seen]

    # -------------------------------------------------------------- update
    def update(self, iteration: int, time_ms: int, win: Window, scores: RankScores,
               floors: FloorScores, balance_hot: np.ndarray, balance_ratio: np.ndarray,
               present: np.ndarray) -> list[Incident]:
        """One iteration; returns the incidents created or changed by it."""
        changed: dict[str, Incident] = {}
        cfg = self.cfg
        hot = scores.hot
        prev = self.streak
        self.onset = np.where(hot & (prev == 0), iteration, self.onset)
        self.streak = np.where(hot, prev + 1, np.where(present[:, None], 0, prev))
        with np.errstate(invalid="ignore"):
            cur = np.fmax(scores.smooth_ratio, scores.ratio)
        self.peak = np.where(hot & (prev == 0), cur, np.where(hot, np.fmax(self.peak, cur), self.peak))
        zn = np.nan_to_num(scores.z_now)
        self.peak_z = np.where(hot & (prev == 0), zn, np.where(hot, np.maximum(self.peak_z, zn), self.peak_z))

        # transient stalls: short hot streaks that ended, big enough
        ended = (~hot) & (prev > 0) & (prev <= cfg.transient_max) & ~self.assigned & present[:, None]
        # a stall is big: beyond abs_ratio, and beyond what this stage's noise does in one
        # iteration (a noisy data loader reaches 1.9x now and then; a JIT stall is seconds)
        ended &= (self.peak >= cfg.abs_ratio) & (self.peak_z >= cfg.transient_z)
        if ended.any():
            for inc in self._new_rank_incidents(ended, "transient", iteration, time_ms, win, scores):
                inc.status = "resolved"
                inc.resolved_iteration = iteration
                changed[inc.id] = inc

        # persistent stragglers
        confirmed = hot & (self.streak > cfg.transient_max) & ~self.assigned
        if confirmed.any():
            for inc in self._new_rank_incidents(confirmed, "persistent", iteration, time_ms, win, scores):
                changed[inc.id] = inc

        for inc in self._update_link(iteration, time_ms, win, floors, scores):
            changed[inc.id] = inc
        for inc in self._update_balance(iteration, time_ms, win, balance_hot, balance_ratio):
            changed[inc.id] = inc
        for inc in self._update_silent(iteration, time_ms, present):
            changed[inc.id] = inc
        for inc in self._resolve(iteration, hot, floors, balance_hot, present):
            changed[inc.id] = inc
        for inc in changed.values():
            inc.updated_ms = time_ms
        return list(changed.values())

    # ------------------------------------------------- rank-level incidents
    def _new_rank_incidents(self, cells: np.ndarray, mode: str, iteration: int, time_ms: int,
                            win: Window, scores: RankScores) -> list[Incident]:
        out: list[Incident] = []
        ranks_c, stages_c = np.nonzero(cells)
        for s in np.unique(stages_c):
            ranks = np.unique(ranks_c[stages_c == s])
            stage = self.stages.stages[s]
            cls = ("transient_stall" if mode == "transient"
                   else "host_stall" if stage.kind == "host" else "compute_straggler")
            onsets = self.onset[ranks, s]
            # ranks that fit an open incident of the same class join it
            if mode == "persistent":
                for inc in self.open_incidents():
                    if inc.cls != cls:
                        continue
                    overlap = np.isin(ranks, inc.ranks)
                    near = np.abs(onsets - inc.onset_iteration) <= cfg_gap(self.cfg)
                    close = _distance(ranks, np.asarray(inc.ranks)) <= self.topo.gpus_per_node
                    join = overlap | (near & close & (inc.stage == stage.name))
                    if (overlap.sum() >= 0.5 * len(ranks)) or join.any():
                        take = ranks[join | (overlap.sum() >= 0.5 * len(ranks))]
                        self.assigned[take, s] = True
                        if inc.stage == stage.name and not np.isin(take, inc.ranks).all():
                            inc.ranks = sorted(set(inc.ranks) | set(take.tolist()))
                            inc.nodes = self.topo.nodes_of(inc.ranks).tolist()
                            self._evidence(inc, iteration, win, scores)
                            out.append(inc)
                        keep = ~np.isin(ranks, take)
                        ranks, onsets = ranks[keep], onsets[keep]
                    if not len(ranks):
                        break
            if not len(ranks):
                continue
            # split the rest by onset (ranks that went slow together are one fault)
            order = np.argsort(onsets, kind="stable")
            ranks, onsets = ranks[order], onsets[order]
            cuts = np.flatnonzero(np.diff(onsets) > cfg_gap(self.cfg)) + 1
            parts = []
            for part_r, part_o in zip(np.split(ranks, cuts), np.split(onsets, cuts), strict=True):
                # ...and that sit together (same or neighbouring nodes): faults elsewhere are others
                o = np.argsort(part_r, kind="stable")
                part_r, part_o = part_r[o], part_o[o]
                gaps = np.flatnonzero(np.diff(part_r) > self.topo.gpus_per_node) + 1
                parts += list(zip(np.split(part_r, gaps), np.split(part_o, gaps), strict=True))
            for part_r, part_o in parts:
                onset = int(part_o.min())
                inc = Incident(
                    id=incident_id(cls, onset, part_r), job=self.job, cls=cls,
                    ranks=sorted(part_r.tolist()), nodes=self.topo.nodes_of(part_r).tolist(),
                    stage=stage.name, ratio=1.0, group_type=None, group_ranks=[],
                    onset_iteration=onset, onset_ms=win.time_of(onset, time_ms),
                )
                if mode == "persistent":
                    self.assigned[part_r, s] = True
                self._evidence(inc, iteration, win, scores)
                self._judge_events(inc, win)
                self._register(inc)
                out.append(inc)
        return out

    def _evidence(self, inc: Incident, iteration: int, win: Window, scores: RankScores) -> None:
        """Ratio, localising group, collective behaviour and the L1 context of a rank incident."""
        s = self.stages.index(inc.stage)
        ranks = np.asarray(inc.ranks, dtype=np.int64)
        since = win.since(inc.onset_iteration, inc.resolved_iteration if inc.resolved_iteration >= 0 else None)
        vals = win.values[since][:, :, s]                       # [T, R]
        peers = peer_kind(self.topo)
        culprit_ms = float(np.nanmedian(vals[:, ranks]))
        # peers' median with the culprits left out (robust for small groups too)
        v_wo = vals.copy()
        v_wo[:, ranks] = np.nan
        peer_med = group_medians(v_wo.T, self.topo.members(peers))   # [G, T]
        gid = self.topo.group_ids(peers)[ranks]
        group_median_ms = float(np.nanmedian(peer_med[gid]))
        ratio = culprit_ms / group_median_ms if group_median_ms > 0 else float("nan")
        inc.ratio = ratio
        # localising group: the smallest group holding every culprit in which they stand out
        loc_kind, loc_ranks, loc_cv = peers, self.topo.group_ranks(peers, int(ranks[0])), float("nan")
        for kind in _LOCAL_KINDS:
            if self.topo.group_size(kind) < 2:
                continue
            members = self.topo.group_ranks(kind, int(ranks[0]))
            if not np.isin(ranks, members).all() or len(members) <= len(ranks):
                continue
            others = np.setdiff1d(members, ranks)
            med_others = float(np.nanmedian(vals[:, others]))
            if med_others > 0 and culprit_ms / med_others >= 1 + (ratio - 1) / 2:
                loc_kind, loc_ranks = kind, members
                break
        g = vals[:, loc_ranks]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # iterations where the group is silent
            loc_cv = float(np.nanmedian(np.nanstd(g, axis=1) / np.nanmean(g, axis=1)))
        inc.group_type, inc.group_ranks = loc_kind, loc_ranks.tolist()
        # collectives: culprits short (arrived last), their group-mates long (waiting)
        comm = []
        short = 0
        for j, st in enumerate(self.stages):
            if st.kind != "comm" or self.topo.group_size(st.group) < 2:
                continue
            cv = win.values[since][:, :, j]
            mates = np.setdiff1d(self.topo.members(st.group)[np.unique(self.topo.group_ids(st.group)[ranks])].reshape(-1), ranks)
            c_ms = float(np.nanmedian(cv[:, ranks]))
            m_ms = float(np.nanmedian(cv[:, mates])) if len(mates) else float("nan")
            before = win.before(inc.onset_iteration)
            m_before = float(np.nanmedian(win.values[before][:, :, j][:, mates])) if len(mates) and before.any() else float("nan")
            is_short = bool(np.isfinite(m_ms) and c_ms < 0.8 * m_ms)
            short += is_short
            comm.append({"stage": st.name, "group": st.group, "culprit_ms": round(c_ms, 3),
                         "groupmates_ms": round(m_ms, 3), "groupmates_before_ms": round(m_before, 3),
                         "culprits_short": is_short})
        arrived_last = bool(comm) and short >= max(1, len(comm) // 2)
        compute_only = self.stages[inc.stage].kind == "compute"
        nodes = format_ranks(inc.nodes)
        ratio_txt = f"{ratio:.1f}x" if np.isfinite(ratio) else "?"
        summary = (f"Ranks {format_ranks(inc.ranks)} (node {nodes}) take {ratio_txt} the time of their "
                   f"{loc_kind.upper() if loc_kind in ('ep', 'dp', 'tp') else loc_kind} group "
                   f"{format_ranks(loc_ranks)} in {inc.stage}"
                   f"{', a compute-only stage' if compute_only else ', a host-side stage'}"
                   f" ({culprit_ms:.0f} ms vs {group_median_ms:.0f} ms; group CV {loc_cv:.2f}).")
        if arrived_last:
            ex = next(c for c in comm if c["culprits_short"])
            summary += (f" Their own collectives are short ({ex['stage']} {ex['culprit_ms']:.0f} ms vs "
                        f"{ex['groupmates_ms']:.0f} ms for their group-mates): they arrive last and the "
                        f"group waits for them, so the slowness travels as communication waits.")
        if self.last_step:
            summary += (f" Job iteration time {self.last_step['before_ms'] / 1000:.1f} s -> "
                        f"{self.last_step['after_ms'] / 1000:.1f} s at iteration {self.last_step['iteration']}.")
        if inc.cls == "transient_stall":
            summary += f" It lasted {max(1, iteration - inc.onset_iteration)} iteration(s) and passed."
        inc.evidence = {
            "summary": summary, "stage": inc.stage, "stage_kind": self.stages[inc.stage].kind,
            "ratio": round(ratio, 3), "culprit_ms": round(culprit_ms, 3),
            "group_median_ms": round(group_median_ms, 3), "peer_group": peers,
            "group": {"type": loc_kind, "id": int(self.topo.group_ids(loc_kind)[ranks[0]]),
                      "ranks": format_ranks(loc_ranks), "cv": round(loc_cv, 3)},
            "collectives": comm, "arrived_last": arrived_last, "l1": self.last_step,
        }

    # ------------------------------------------------------------- links
    def _update_link(self, iteration, time_ms, win, floors: FloorScores, scores: RankScores) -> list[Incident]:
        hot_ranks = scores.hot.any(axis=1)
        if hot_ranks.any():
            # a straggler's delay travels along its pipelines; floors of groups on those
            # pipelines are explained by it, not by a link
            tainted = np.zeros(self.topo.world, dtype=bool)
            pipes = np.unique(self.topo.group_ids("pipeline")[hot_ranks])
            tainted[self.topo.members("pipeline")[pipes].reshape(-1)] = True
            floors = _untaint(self.topo, floors, tainted)
        culprits, stage, ratio = intersect_risen(self.topo, floors)
        # a degraded link slows every kind of collective its ranks take part in; floors of a
        # single kind rising is the chunk waiting on someone (e.g. a late data loader)
        kinds_risen = {k for k, r in zip(floors.kind, floors.risen, strict=True) if r.any()}
        if len(set(floors.kind)) >= 2 and len(kinds_risen) < 2:
            culprits = np.empty(0, np.int64)
        if len(culprits) > 1:
            culprits = self._refine_by_p2p(culprits, scores)
        if not len(culprits):
            self.link = None
            return []
        ep = self.link
        if ep is not None and _overlap(ep.ranks, culprits) >= 0.5:
            ep.streak += 1
            ep.count(culprits)
            # what stays risen in most iterations is the culprit; chance risers drop out
            steady = ep.steady()
            ep.ranks = steady if len(steady) else culprits
            ep.ratio = max(ep.ratio, ratio)
            ep.stage = stage or ep.stage
        else:
            self.link = ep = _Episode(culprits, stage, ratio, iteration, time_ms)
            ep.count(culprits)
        if ep.streak != self.cfg.transient_max + 1:
            return []
        for inc in self.open_incidents():
            if inc.cls == "link_degradation" and _overlap(np.asarray(inc.ranks), ep.ranks) >= 0.5:
                return []
        inc = Incident(id=incident_id("link_degradation", ep.onset, ep.ranks), job=self.job,
                       cls="link_degradation", ranks=ep.ranks.tolist(),
                       nodes=self.topo.nodes_of(ep.ranks).tolist(), stage=ep.stage, ratio=float(ep.ratio),
                       group_type=None, group_ranks=[], onset_iteration=ep.onset, onset_ms=ep.onset_ms)
        risen = [(n, k, float(np.nanmax(r[m]))) for n, k, r, m in
                 zip(floors.stage, floors.kind, floors.ratio, floors.risen, strict=True) if m.any()]
        kinds = sorted({k for _, k, _ in risen}, key=self.topo.group_size)
        inc.group_type = kinds[0] if kinds else None
        if inc.group_type:
            inc.group_ranks = self.topo.group_ranks(inc.group_type, int(ep.ranks[0])).tolist()
        txt = ", ".join(f"{n} ({k}) x{r:.1f}" for n, k, r in risen)
        inc.evidence = {
            "summary": (f"The transfer floor (the fastest member's time, i.e. pure transfer) rose in every "
                        f"collective group of ranks {format_ranks(ep.ranks)} (node {format_ranks(inc.nodes)}): "
                        f"{txt}. Compute stages are normal, so the ranks at the intersection of those "
                        f"groups have slow transfers: a degraded link or NIC."),
            "stage": ep.stage, "ratio": round(float(ep.ratio), 3), "risen_floors": risen,
            "group": {"type": inc.group_type, "ranks": format_ranks(inc.group_ranks)}, "l1": self.last_step,
        }
        self._judge_events(inc, win)
        self._register(inc)
        return [inc]

    def _refine_by_p2p(self, culprits: np.ndarray, scores: RankScores) -> np.ndarray:
        """Within a collective group every member sees the same slow transfer; a pipeline hop
        involves only the two ranks it joins. Keep the candidates whose own p2p times rose."""
        p2p = [i for i, st in enumerate(self.stages) if st.kind == "comm" and st.group == "pipeline"]
        if not p2p or self.topo.pp < 2:
            return culprits
        with np.errstate(invalid="ignore"):
            rose = (scores.rel[np.ix_(culprits, p2p)] > np.log1p(self.cfg.floor_change)).any(axis=1)
        return culprits[rose] if rose.any() else culprits

    # ---------------------------------------------------------- pipeline
    def _update_balance(self, iteration, time_ms, win, hot: np.ndarray, ratio: np.ndarray) -> list[Incident]:
        if not hot.any():
            self.balance = None
            return []
        groups, stages = np.nonzero(hot)
        best = int(np.argmax(ratio[groups, stages]))
        s = int(stages[best])
        ranks = np.sort(self.topo.members("dp")[np.unique(groups[stages == s])].reshape(-1))
        ep = self.balance
        if ep is not None and _jaccard(ep.ranks, ranks) >= 0.5:
            ep.streak += 1
        else:
            self.balance = ep = _Episode(ranks, self.stages.names[s], float(ratio[groups[best], s]), iteration, time_ms)
        if ep.streak != self.cfg.transient_max + 1:
            return []
        for inc in self.open_incidents():
            if inc.cls == "pipeline_imbalance" and _jaccard(np.asarray(inc.ranks), ep.ranks) >= 0.5:
                return []
        pps = np.unique(self.topo.pp_index[ep.ranks])
        inc = Incident(id=incident_id("pipeline_imbalance", ep.onset, ep.ranks), job=self.job,
                       cls="pipeline_imbalance", ranks=ep.ranks.tolist(),
                       nodes=self.topo.nodes_of(ep.ranks).tolist(), stage=ep.stage,
                       ratio=float(ratio[groups[best], s]), group_type="pipeline",
                       group_ranks=self.topo.group_ranks("pipeline", int(ep.ranks[0])).tolist(),
                       onset_iteration=ep.onset, onset_ms=ep.onset_ms)
        inc.evidence = {
            "summary": (f"Pipeline stage(s) pp={format_ranks(pps)} take {inc.ratio:.2f}x their usual share of "
                        f"{ep.stage} against the other stages, on all their ranks alike (no rank stands out "
                        f"in its DP group): the stage has more work, and the other stages wait in pipeline "
                        f"bubbles (pp_recv/pp_send)."),
            "stage": ep.stage, "ratio": round(inc.ratio, 3), "pp": pps.tolist(),
            "group": {"type": "pipeline", "ranks": format_ranks(inc.group_ranks)}, "l1": self.last_step,
        }
        self._judge_events(inc, win)
        self._register(inc)
        return [inc]

    # ------------------------------------------------------------ silence
    def _update_silent(self, iteration, time_ms, present: np.ndarray) -> list[Incident]:
        self.missing_since = np.where(present, 0, np.where(self.missing == 0, iteration, self.missing_since))
        self.missing = np.where(present, 0, self.missing + 1)
        self.seen |= present
        if present.mean() < 0.5:
            return []
        silent = self.seen & (self.missing >= self.cfg.silent_after)
        taken = np.zeros_like(silent)
        for inc in self.open_incidents():
            if inc.cls == "silent_rank":
                taken[np.asarray(inc.ranks, dtype=np.int64)] = True
        new = np.flatnonzero(silent & ~taken)
        if not len(new):
            return []
        onset = int(self.missing_since[new].min())
        inc = Incident(id=incident_id("silent_rank", onset, new), job=self.job, cls="silent_rank",
                       ranks=new.tolist(), nodes=self.topo.nodes_of(new).tolist(), stage=None, ratio=0.0,
                       group_type="node", group_ranks=self.topo.node_ranks(self.topo.nodes_of(new)).tolist(),
                       onset_iteration=onset, onset_ms=time_ms)
        inc.evidence = {"summary": (f"Ranks {format_ranks(new)} (node {format_ranks(inc.nodes)}) stopped reporting "
                                    f"at iteration {onset} while the other ranks go on: a hung or crashed "
                                    f"process, or its collector.")}
        self._register(inc)
        return [inc]

    # ---------------------------------------------------------- resolution
    def _resolve(self, iteration, hot, floors, balance_hot, present) -> list[Incident]:
        out = []
        for inc in self.open_incidents():
            ranks = np.asarray(inc.ranks, dtype=np.int64)
            if inc.cls in ("compute_straggler", "host_stall"):
                s = self.stages.index(inc.stage)
                rep = present[ranks]
                active = rep.any() and hot[ranks[rep], s].mean() >= 0.5
                if not rep.any():
                    active = True
            elif inc.cls == "link_degradation":
                active = self.link is not None and _overlap(self.link.ranks, ranks) >= 0.5
            elif inc.cls == "pipeline_imbalance":
                active = self.balance is not None
            elif inc.cls == "silent_rank":
                active = not present[ranks].all()
            else:
                continue
            q = 0 if active else self.quiet.get(inc.id, 0) + 1
            self.quiet[inc.id] = q
            if q >= (1 if inc.cls == "silent_rank" else self.cfg.resolve_after):
                inc.status = "resolved"
                inc.resolved_iteration = iteration - q + 1
                if inc.cls in ("compute_straggler", "host_stall"):
                    self.assigned[ranks, self.stages.index(inc.stage)] = False
                out.append(inc)
        return out

    # -------------------------------------------------------------- events
    def _judge_events(self, inc: Incident, win: Window) -> None:
        start = win.time_of(inc.onset_iteration - self.cfg.event_lookback, inc.onset_ms)
        verdicts = []
        for e in self.events:
            if e["time"] < start:
                continue
            node = int(e["node"])
            on_culprit = node in inc.nodes
            v, reason = verdict(category(e["name"]), inc.cls, on_culprit)
            verdicts.append(EventVerdict(e["name"], node, v, reason, int(e["time"])))
        inc.events = verdicts

    def rejudge_events(self, win: Window) -> list[Incident]:
        """Events that arrived after an incident opened (the write-up's port-down came one iteration later)."""
        out = []
        for inc in self.open_incidents():
            before = [(e.name, e.node, e.verdict) for e in inc.events]
            self._judge_events(inc, win)
            if [(e.name, e.node, e.verdict) for e in inc.events] != before:
                out.append(inc)
        return out


def _untaint(topo: Topology, floors: FloorScores, tainted: np.ndarray) -> FloorScores:
    """The floor scores with groups mostly made of tainted ranks no longer risen."""
    risen = []
    for kind, r in zip(floors.kind, floors.risen, strict=True):
        bad = tainted[topo.members(kind)].mean(axis=1) > 0.5
        risen.append(r & ~bad)
    return FloorScores(floors.stage, floors.kind, floors.floor, floors.ratio, risen)


def cfg_gap(cfg: AnalyzerConfig) -> int:
    """Onsets this close belong to one fault."""
    return cfg.transient_max + 1


def _distance(ranks: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Per rank, the distance to the nearest of ``others`` (sorted or not)."""
    if not len(others):
        return np.full(len(ranks), np.iinfo(np.int64).max)
    o = np.sort(others)
    i = np.clip(np.searchsorted(o, ranks), 1, len(o) - 1) if len(o) > 1 else np.zeros(len(ranks), np.int64)
    lo = np.abs(ranks - o[np.maximum(i - 1, 0)])
    hi = np.abs(ranks - o[i])
    return np.minimum(lo, hi)


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Share of the smaller set that the two have in common (the overlap coefficient)."""
    if not len(a) or not len(b):
        return 0.0
    return len(np.intersect1d(a, b)) / min(len(a), len(b))


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b))
    return inter / (len(a) + len(b) - inter)
