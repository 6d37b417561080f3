"""The simulator: a cluster model that writes ``stage_latency`` as real collectors would.

Owns a hybrid-parallel job in which slowness travels as on real hardware (a slow rank
makes its collectives' peers wait), its scenarios (``scenarios/*.toml``), their ground
truth, and ``rankscope simulate``. Rows are built by :func:`rankscope.stage_rows.stage_rows`.

May import: the core (``rankscope``) only, and itself; no other component.
"""
