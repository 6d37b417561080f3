"""Rule: pipeline imbalance, a whole PP stage computing more than it used to or than the others.

When one pipeline stage gets more work its ranks are all equally slow, so no
rank stands out inside its DP group; the DP group itself stands out against
its own past or, long from the start, against the other stages (:class:`~analyzer.score.stage_balance.PipelineBalanceScorer`), and the
other stages wait in pipeline bubbles. An episode of hot DP groups that stays
(Jaccard >= 0.5 from one iteration to the next) for ``transient_max + 1``
iterations is an incident; it stays active while any group is hot.

Example::

    >>> from analyzer.config import AnalyzerConfig
    >>> from rankscope.schema import DEFAULT_STAGES
    >>> from rankscope.topology import Topology
    >>> [c.value for c in PipelineRule("j", Topology(pp=2, dp=8, ep=4, gpus_per_node=4), DEFAULT_STAGES,
    ...                                 AnalyzerConfig()).classes]
    ['pipeline_imbalance']
"""

from __future__ import annotations

import numpy as np

from analyzer.config import AnalyzerConfig
from analyzer.diagnosis.book import IncidentBook
from analyzer.diagnosis.observation import Observation
from analyzer.diagnosis.rank_sets import jaccard
from analyzer.diagnosis.rule import Episode, Rule, culprit_incident
from rankscope.incident import Incident, IncidentClass
from rankscope.schema import StageSet
from rankscope.topology import Topology, format_ranks


class PipelineRule(Rule):
    """A PP stage slower than its own past, or far slower than the other stages."""

    classes = (IncidentClass.PIPELINE_IMBALANCE,)

    def __init__(self, job: str, topo: Topology, stages: StageSet, cfg: AnalyzerConfig):
        super().__init__(job, topo, stages, cfg)
        self.episode: Episode | None = None

    def detect(self, obs: Observation, book: IncidentBook) -> list[Incident]:
        hot, ratio = obs.balance_hot, obs.balance_ratio
        if not hot.any():
            self.episode = None
            return []
        groups, stages = np.nonzero(hot)
        best = int(np.argmax(ratio[groups, stages]))
        s = int(stages[best])
        ranks = np.sort(self.topo.members("dp")[np.unique(groups[stages == s])].reshape(-1))
        ep = self.episode
        if ep is not None and jaccard(ep.ranks, ranks) >= 0.5:
            ep.streak += 1
        else:
            self.episode = ep = Episode(ranks, self.stages.names[s], float(ratio[groups[best], s]),
                                        obs.iteration, obs.time_ms)
        if ep.streak < self.cfg.transient_max + 1:
            return []
        for inc in book.open():
            if inc.cls == IncidentClass.PIPELINE_IMBALANCE and jaccard(np.asarray(inc.ranks), ep.ranks) >= 0.5:
                return []
        pps = np.unique(self.topo.pp_index[ep.ranks])
        static = obs.balance_static is not None and bool(obs.balance_static[groups[best], s])
        share = ("the median of the other stages' share" if static else "their usual share")
        inc = culprit_incident(self.job, IncidentClass.PIPELINE_IMBALANCE, ep.ranks, self.topo, ep.onset,
                               ep.onset_ms, stage=ep.stage, ratio=float(ratio[groups[best], s]),
                               group_type="pipeline",
                               group_ranks=self.topo.group_ranks("pipeline", int(ep.ranks[0])).tolist())
        inc.evidence = {
            "summary": (f"Pipeline stage(s) pp={format_ranks(pps)} take {inc.ratio:.2f}x {share} of "
                        f"{ep.stage}, on all their ranks alike (no rank stands out "
                        f"in its DP group): the stage has more work, and the other stages wait in pipeline "
                        f"bubbles (pp_recv/pp_send)."),
            "stage": ep.stage, "ratio": round(inc.ratio, 3), "pp": pps.tolist(),
            "against": "other_stages" if static else "own_past",
            "group": {"type": "pipeline", "ranks": format_ranks(inc.group_ranks)}, "l1": obs.l1_step,
        }
        bubbles = self.bubbles(obs)
        if bubbles is not None:
            inc.evidence["bubble_ms"] = bubbles
            inc.evidence["summary"] += (" Bubbles (pp_recv + pp_send, median ms) by stage: "
                                        + ", ".join(f"pp={p} {'-' if b is None else f'{b:g}'}"
                                                    for p, b in enumerate(bubbles)) + ".")
        inc = book.register(inc)
        book.judge_events(inc, obs.window)
        return [inc]

    def bubbles(self, obs: Observation) -> list[float | None] | None:
        """The pipeline bubbles of the latest iteration: per PP stage, the median over its ranks of
        the time spent in the pipeline's transfers (waiting for the next or previous stage). A
        stage with more work waits least; asymmetric bubbles show it even when gradient sync
        evens out the iteration time (ARGUS's pipeline-bubble amplification). None without
        pipeline transfer stages."""
        cols = [i for i, st in enumerate(self.stages.stages) if st.kind == "comm" and st.group == "pipeline"]
        if not cols or self.topo.pp < 2 or not len(obs.window):
            return None
        per_rank = np.nansum(obs.window.recent(1)[-1][:, cols], axis=1)
        per_rank[~obs.present] = np.nan
        med = [np.nanmedian(per_rank[self.topo.pp_index == p]) if obs.present[self.topo.pp_index == p].any()
               else float("nan") for p in range(self.topo.pp)]
        return [round(float(m), 1) if np.isfinite(m) else None for m in med]

    def active(self, inc: Incident, obs: Observation) -> bool:
        return self.episode is not None and jaccard(self.episode.ranks, np.asarray(inc.ranks)) >= 0.5

