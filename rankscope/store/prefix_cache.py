"""Encoded tag prefixes of the series a writer sends again and again, keyed by rank.

A rank's ``stage_latency`` tags (job, rank, pp, dp, ..., host) are the same in
every point it sends, so the text ``stage_latency,job=..,rank=..,...`` is
encoded once and looked up afterwards. The lookup is by the ``rank`` tag and is
checked, vectorised, against every tag column of the new rows: a row whose tags
differ from the cached ones (a rank moved to another host after an elastic
restart, another job) is encoded afresh and replaces the cache entry, so the
cache can never send a stale tag. Frames without an integer ``rank`` tag are
encoded directly, and so are frames in which a rank has more than one row (its
rank then does not name one series).

Example::

    >>> import pandas as pd
    >>> cache = PrefixCache()
    >>> tags = pd.DataFrame({"job": ["j", "j"], "rank": [0, 1]})
    >>> cache.prefixes("m", tags).tolist()
    ['m,job=j,rank=0', 'm,job=j,rank=1']
    >>> cache.prefixes("m", pd.DataFrame({"job": ["k"], "rank": [1]})).tolist()
    ['m,job=k,rank=1']
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rankscope.lineprotocol import encode_prefixes


@dataclass
class _Entry:
    """Per rank: the tag values last encoded (one array per tag column) and the prefix."""

    columns: tuple[str, ...]
    kinds: tuple[str, ...]
    values: list[np.ndarray] = field(default_factory=list)
    prefix: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))

    def grow(self, size: int) -> None:
        old = len(self.prefix)
        if size <= old:
            return
        size = max(size, 2 * old)
        prefix = np.full(size, None, dtype=object)
        prefix[:old] = self.prefix
        self.prefix = prefix
        grown = []
        for col, kind in zip(self.values, self.kinds, strict=True):
            new = np.zeros(size, dtype=np.int64) if kind == "i" else np.full(size, None, dtype=object)
            new[:old] = col
            grown.append(new)
        self.values = grown


class PrefixCache:
    """Tag prefixes by (measurement, tag columns), looked up by rank."""

    def __init__(self, max_ranks: int = 1 << 22):
        self.max_ranks = max_ranks
        self._entries: dict[tuple[str, tuple[str, ...]], _Entry] = {}
        self._lock = threading.Lock()

    def prefixes(self, measurement: str, tags: pd.DataFrame) -> np.ndarray:
        """``measurement,tag=value,...`` of every row of ``tags`` (as :func:`encode_prefixes`)."""
        with self._lock:
            return self._prefixes(measurement, tags)

    def _prefixes(self, measurement: str, tags: pd.DataFrame) -> np.ndarray:
        if "rank" not in tags.columns or not len(tags):
            return encode_prefixes(measurement, tags)
        ranks = tags["rank"].to_numpy()
        if (ranks.dtype.kind not in "iu" or ranks.min() < 0 or ranks.max() >= self.max_ranks
                or len(np.unique(ranks)) != len(ranks)):
            # not one series per rank here (e.g. a rank's row per stage): nothing to reuse
            return encode_prefixes(measurement, tags)
        columns = tuple(tags.columns)
        arrays = [tags[c].to_numpy() for c in columns]
        kinds = tuple("i" if a.dtype.kind in "iu" else "o" for a in arrays)
        key = (measurement, columns)
        entry = self._entries.get(key)
        if entry is None or entry.kinds != kinds:
            entry = self._entries[key] = _Entry(columns, kinds, [np.empty(0, np.int64) if k == "i"
                                                                  else np.empty(0, object) for k in kinds])
        entry.grow(int(ranks.max()) + 1)
        known = entry.prefix[ranks] != None  # noqa: E711 - elementwise on an object array
        for col, cached, kind in zip(arrays, entry.values, kinds, strict=True):
            if not known.any():
                break
            if kind == "i":
                known &= cached[ranks] == col
            else:
                known &= cached[ranks] == col.astype(object)
        fresh = np.flatnonzero(~known)
        if len(fresh):
            text = encode_prefixes(measurement, tags.iloc[fresh])
            r = ranks[fresh]
            entry.prefix[r] = text
            for col, cached in zip(arrays, entry.values, strict=True):
                cached[r] = col[fresh]
        return entry.prefix[ranks]
