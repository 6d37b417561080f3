"""``rankscope analyze``: the scheduled analyzer (or one cycle with ``--once``)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys

from analyzer.config import AnalyzerConfig
from analyzer.cycle import AnalyzerService
from rankscope.schema import DEFAULT_STAGES, StageSet
from rankscope.store import open_store

log = logging.getLogger("rankscope.analyze")


def parse_interval(text: str) -> float:
    """``30s``, ``2m``, ``1h`` or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"interval {text!r}: expected e.g. 30s, 2m, 1h")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError("interval must be positive")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser(
        "analyze", help="run the analyzer: L1 change points, L2 group scores, diagnosis",
        description="Read stage latencies from the store, find iteration-time change points (L1), "
                    "score ranks inside their parallel groups (L2), diagnose culprit ranks/node/class, "
                    "and write l1_changepoint, l2_group, l2_rank and incident points back. Runs every "
                    "--every interval (APScheduler; a failed cycle is logged and the next one runs), "
                    "or once with --once.")
    add_store_options(p)
    p.add_argument("--job", action="append", help="analyze only this job (repeatable; default: every job)")
    p.add_argument("--every", type=parse_interval, default=30.0, metavar="INTERVAL",
                   help="cycle interval, e.g. 30s, 2m (default 30s)")
    p.add_argument("--once", action="store_true", help="run one cycle over the stored data and exit")
    p.add_argument("--json", action="store_true", help="with --once: print {\"incidents\": [...]} as JSON")
    p.add_argument("--config", metavar="TOML", help="thresholds ([analyzer] table) and stages ([stages] table)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def load_config(path: str | None) -> tuple[AnalyzerConfig, StageSet | None]:
    if not path:
        return AnalyzerConfig(), None
    import tomllib
    from pathlib import Path

    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read config {path}: {exc}") from exc
    unknown = set(data) - {"analyzer", "stages"}
    if unknown:
        raise ValueError(f"config {path}: unknown table(s) {', '.join(sorted(unknown))}; known: analyzer, stages")
    cfg = AnalyzerConfig().with_overrides(**data.get("analyzer", {}))
    stages = StageSet.from_config(data["stages"]) if "stages" in data else None
    return cfg, stages


def run(args: argparse.Namespace) -> int:
    cfg, stages = load_config(args.config)
    store = open_store(args.store, args.bucket)
    svc = AnalyzerService(store, cfg, stages, jobs=args.job, progress=not args.quiet and not args.json)
    if args.once:
        report = svc.cycle(final=True)
        incidents = [i.to_json() for i in svc.incidents()]
        if args.json:
            print(json.dumps({"incidents": incidents}, indent=2))
        else:
            if not svc.analyzers:
                print(f"no stage_latency data in {store!r}" + (f" for job(s) {', '.join(args.job)}" if args.job else ""))
            for job, n in report.iterations.items():
                print(f"{job}: analyzed {n} iteration(s)")
            for inc in incidents:
                print(f"[{inc['status']}] {inc['id']} {inc['title']}")
            print(f"read {report.read_s:.1f}s, analysis {report.analyze_s:.1f}s, write {report.write_s:.1f}s")
        store.close()
        return 0
    scheduler = build_scheduler(svc, args.every, blocking=True)
    print(f"analyzing {store!r} every {args.every:g}s (Ctrl-C to stop)", file=sys.stderr)
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        store.close()
    return 0


def safe_cycle(svc: AnalyzerService) -> bool:
    """One cycle; an error (database down, bad data) is logged, not raised, so the next cycle runs."""
    try:
        report = svc.cycle()
    except Exception as exc:  # noqa: BLE001 - the scheduler must go on
        log.error("analyzer cycle failed: %s: %s", type(exc).__name__, exc)
        return False
    for inc in report.incidents:
        log.warning("incident %s [%s] %s", inc.id, inc.status, inc.title)
    if report.iterations:
        log.info("cycle: %s; read %.2fs analysis %.2fs write %.2fs",
                 ", ".join(f"{j}: {n} it" for j, n in report.iterations.items()),
                 report.read_s, report.analyze_s, report.write_s)
    return True


def build_scheduler(svc: AnalyzerService, every_s: float, blocking: bool = True):
    """APScheduler 3.x: an interval job with coalescing, one instance at a time, a misfire grace."""
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.schedulers.blocking import BlockingScheduler

    cls = BlockingScheduler if blocking else BackgroundScheduler
    sched = cls(job_defaults={"coalesce": True, "max_instances": 1,
                              "misfire_grace_time": max(1, int(every_s))})
    sched.add_job(safe_cycle, "interval", args=[svc], seconds=every_s, id="analyzer-cycle",
                  next_run_time=_now())
    return sched


def _now():
    import datetime as dt

    return dt.datetime.now(dt.UTC)


__all__ = ["build_scheduler", "parse_interval", "register", "run", "safe_cycle", "DEFAULT_STAGES"]
