"""Scoring: each iteration's ranks, groups and pipeline stages measured against their peers.

Third hop of the analyzer's flow (read -> detect -> **score** -> diagnosis -> write). Owns the
rank scores (:mod:`~analyzer.score.rank_scores`: each cell's ratio to its peers, hot cells),
the transfer floors of the collectives (:mod:`~analyzer.score.transfer_floors`), the balance
of the pipeline stages (:mod:`~analyzer.score.stage_balance`), the ``l2_group``/``l2_rank``
points (:mod:`~analyzer.score.l2_points`) and an incident's cost (:mod:`~analyzer.score.impact`,
its what-if with the culprits restored in :mod:`~analyzer.score.what_if`).
Pure computation: no I/O.

May import: the core (``rankscope``: topology, schema, the incident model),
``analyzer.config``, ``analyzer.detect`` and itself; not ``diagnosis/``, ``write/``,
``read/`` or ``service/``.
"""
