"""Detection: the statistics that say something moved, before anybody is blamed.

Second hop of the analyzer's flow (read -> **detect** -> score -> diagnosis -> write). Owns
the L1 detectors of the iteration time (:mod:`~analyzer.detect.step` for persistent level
shifts, :mod:`~analyzer.detect.spike` for short excursions, both run by
:mod:`~analyzer.detect.l1`), the L2 group statistics (:mod:`~analyzer.detect.group_scores`:
medians, robust sigmas, CV), the per-cell baselines (:mod:`~analyzer.detect.baseline`), the
rolling reference and fast medians they use, and the :class:`~analyzer.detect.window.Window`
of recent iterations every later hop reads. Pure computation on arrays: no I/O.

May import: the core (``rankscope``, though it needs none today), ``analyzer.config`` and
itself; no later hop (``score/``, ``diagnosis/``, ``write/``), nor ``read/`` or ``service/``.
"""
