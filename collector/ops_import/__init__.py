"""Per-operation traces (the StragglerAnalysis format) -> ``stage_latency``.

:mod:`.importer` reads a trace, checks its layout and makes one point per recorded worker per
step through the core's row builder; :mod:`.values` checks every value column by column and
keeps the good rows. ``rankscope import-ops`` (:mod:`collector.ops_cli`) drives it.

May import: the core (``rankscope``), ``collector.untrusted`` and itself.
"""

from collector.ops_import.importer import (
    OPTYPE_STAGES,
    REQUIRED_COLUMNS,
    OpsError,
    OpsLayout,
    check_columns,
    check_times,
    layout,
    read_ops,
    stage_frame,
)

__all__ = ["OPTYPE_STAGES", "REQUIRED_COLUMNS", "OpsError", "OpsLayout", "check_columns",
           "check_times", "layout", "read_ops", "stage_frame"]
