"""The one TOML file every long-running part reads its settings from (``--config``).

Each part owns one table of it: ``[analyzer]`` and ``[stages]`` (the analyzer's thresholds and the
stage declarations, :mod:`analyzer.config`), ``[hardware]`` (where the GPUs' telemetry is) and
``[actions]`` (what may be done on a verdict). A table no part owns is refused by name, so a typo
never silently leaves a setting at its default.

Example::

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "rankscope.toml"
    >>> _ = p.write_text('[analyzer]\\nz = 7.0\\n')
    >>> config_table(p, "analyzer"), config_table(p, "actions")
    ({'z': 7.0}, {})
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

#: The tables a config file may hold.
TABLES = ("analyzer", "stages", "hardware", "actions")


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Every table of the file; ValueError naming the file and what is wrong."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    unknown = set(data) - set(TABLES)
    if unknown:
        raise ValueError(f"config {path}: unknown table(s) {', '.join(sorted(unknown))}; known: {', '.join(TABLES)}")
    for name, table in data.items():
        if not isinstance(table, dict):
            raise ValueError(f"config {path}: [{name}] must be a table")
    return data


def config_table(path: str | Path | None, name: str) -> dict[str, Any]:
    """Table ``name`` of the file (empty without a file or without that table)."""
    if name not in TABLES:
        raise ValueError(f"no config table {name!r}; known: {', '.join(TABLES)}")
    return read_config_file(path).get(name, {}) if path else {}
