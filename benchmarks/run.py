"""Run the benchmarks and rebuild BENCHMARKS.md.

Each ``benchmarks/bench_<area>.py`` has ``run(ctx: BenchContext) -> str`` returning a
Markdown section. Results of each area are kept in ``benchmarks/results/<area>.md``
and BENCHMARKS.md is assembled from all of them, so running one area refreshes its
section without losing the others.

    python -m benchmarks.run               # every area (but those run only when named)
    python -m benchmarks.run encoder sim   # only these areas
    python -m benchmarks.run fleet         # the cluster day: hours at full scale, so only when named
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: Areas run only when named: the cluster day (``bench_fleet.py``) takes hours at its full scale.
NAMED_ONLY = ("fleet",)


@dataclass
class BenchContext:
    """What a benchmark gets: an InfluxDB URL (started for the run) and timing helpers."""

    influx_url: str | None = None
    repeat: int = 7
    notes: list[str] = field(default_factory=list)

    def median_s(self, fn: Callable[[], object], repeat: int | None = None, warmup: int = 1) -> float:
        """Median wall time of ``fn`` over ``repeat`` runs, after ``warmup`` runs."""
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeat or self.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def side_by_side(self, fns: dict[str, Callable[[], object]], repeat: int | None = None) -> dict[str, float]:
        """Medians of several functions measured interleaved (a, b, a, b, ...), so
        machine noise hits them alike; the ratios are the figures to quote."""
        return {k: statistics.median(v) for k, v in self.interleaved(fns, repeat).items()}

    def interleaved(self, fns: dict[str, Callable[[], object]], repeat: int | None = None) -> dict[str, list[float]]:
        """Every wall time of :meth:`side_by_side`'s rounds (sample ``i`` of each function is
        from round ``i``), for a figure that needs the spread, not just the median."""
        for fn in fns.values():
            fn()
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(repeat or self.repeat):
            for k, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                samples[k].append(time.perf_counter() - t0)
        return samples


#: Environment settings that size a benchmark, said with its command: the area's own prefix,
#: and never a setting whose name says it holds a secret or an address.
SIZING_PREFIXES = {"fleet": ("RANKSCOPE_FLEET_",)}
_NOT_SAID = ("TOKEN", "PASSWORD", "SECRET", "URL", "KEY")


def _sizing(area: str) -> str:
    """The sizing settings of this run of ``area``, as they prefix its command (``""``: none)."""
    prefixes = (*SIZING_PREFIXES.get(area, ()), f"RANKSCOPE_BENCH_{area.upper()}_")
    given = sorted((k, v) for k, v in os.environ.items()
                   if k.startswith(prefixes) and v.strip() and not any(w in k for w in _NOT_SAID))
    return "".join(f"{k}={shlex.quote(v)} " for k, v in given)


def areas() -> list[str]:
    return sorted(p.stem[len("bench_"):] for p in (ROOT / "benchmarks").glob("bench_*.py"))


def assemble() -> None:
    parts = [
        "# Benchmarks\n",
        "Produced by `make bench` (`python -m benchmarks.run [AREA ...]`); each section says the "
        "exact command that refreshes it. Figures are medians; where two things are compared they "
        "were measured side by side, interleaved, in one run, and the ratio is the figure to quote "
        "(the machines are noisy).\n",
    ]
    for f in sorted(RESULTS.glob("*.md")):
        parts.append(f.read_text().rstrip() + "\n")
    (ROOT / "BENCHMARKS.md").write_text("\n".join(parts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("areas", nargs="*", help=f"areas to run (default all: {', '.join(areas())}; but "
                                             f"{', '.join(NAMED_ONLY)}, run only when named)")
    ap.add_argument("--repeat", type=int, default=7, help="timed repetitions per measurement (default 7)")
    args = ap.parse_args(argv)
    chosen = args.areas or [a for a in areas() if a not in NAMED_ONLY]
    unknown = set(chosen) - set(areas())
    if unknown:
        ap.error(f"unknown area(s) {', '.join(sorted(unknown))}; known: {', '.join(areas())}")
    sys.path.insert(0, str(ROOT))
    from tests.influx_server import server_or_external

    server, url = server_or_external()
    RESULTS.mkdir(parents=True, exist_ok=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    try:
        for area in chosen:
            print(f"== {area}", flush=True)
            ctx = BenchContext(influx_url=url, repeat=args.repeat)
            t0 = time.perf_counter()
            body = importlib.import_module(f"benchmarks.bench_{area}").run(ctx)
            took = time.perf_counter() - t0
            stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
            text = (f"{body.rstrip()}\n\n_Command: `{_sizing(area)}python -m benchmarks.run {area}` "
                    f"({stamp}, {machine}, {took:.0f} s)._\n")
            (RESULTS / f"{area}.md").write_text(text)
            print(text, flush=True)
    finally:
        if server is not None:
            server.cleanup()
    assemble()
    print(f"wrote {ROOT / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
