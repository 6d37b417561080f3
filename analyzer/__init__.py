"""The analyzer: reads ``stage_latency``, detects, scores, diagnoses and writes back.

Owns one hop of the data, in folders that follow it::

    read/ -> detect/ -> score/ -> diagnosis/ -> write/      (service/ runs the cycle)

- ``read/``: the only reader of ``stage_latency``: whole iterations out of points, the
  topology and placement they describe, the events of a cycle.
- ``detect/``: L1 step and spike detectors, L2 group statistics, baselines, the window.
- ``score/``: transfer floors, stage balance, rank scores, the L2 points, impact.
- ``diagnosis/``: one rule per fault family, data health, event verdicts.
- ``write/``: rollups, change points, L2 points and incidents back to the store.
- ``service/``: the cycle, the schedule, the config watch, the commands.
- ``job_analyzer.py``: one job's streaming state (pure: no I/O); ``config.py``: every threshold.

May import: the core (``rankscope``) only, and itself; no other component.
"""
