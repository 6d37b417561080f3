"""rankscope: fail-slow diagnosis for large distributed GPU training jobs.

The core every component shares, and the only place a fact about the data is decided:
rank topology and placement, the data model (``schema``), the one row builder
(``stage_rows``), the line-protocol encoder, the one store interface and its backends
(``store/``, which also builds every InfluxQL ``FROM``), the incident model, host names,
times, the store options and the ``rankscope`` command line.

May import: itself only. It imports no component (collector, simulator, events, analyzer,
dashboards, evaluation); they meet in the data, through the store.
"""

__version__ = "0.1.0"
