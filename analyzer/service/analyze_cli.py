"""``rankscope analyze``: the scheduled analyzer (or one cycle with ``--once``)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from analyzer.config import load_config
from analyzer.service.after_cycle import AfterCycle, after_cycle
from analyzer.service.analyzer_service import AnalyzerService
from analyzer.service.config_watch import ConfigWatcher
from analyzer.service.hardware_config import AUTH_PREFIX, URL_ENV, hardware_settings
from analyzer.service.hardware_evidence import hardware_evidence
from analyzer.service.schedule import build_scheduler, safe_cycle
from analyzer.service.shards import SHARD_ENV, Shard, ShardSpecError, shard_of
from analyzer.service.stream_cli import add_stream_options, start_stream
from rankscope.cli import add_store_options, require_jobs
from rankscope.config_file import config_table
from rankscope.store import open_store

if TYPE_CHECKING:
    from apscheduler.schedulers.base import BaseScheduler

log = logging.getLogger("rankscope.analyze")

#: Cycle interval of the scheduled analyzer unless --every says otherwise.
DEFAULT_EVERY_S = 30.0
#: How long ``--once`` waits for the actions after its cycle.
ONCE_ACTIONS_S = 300.0


def parse_interval(text: str) -> float:
    """``30s``, ``2m``, ``1h`` or plain seconds -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"interval {text!r}: expected e.g. 30s, 2m, 1h")
    value = float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]
    if value <= 0:
        raise argparse.ArgumentTypeError("interval must be positive")
    return value


def parse_shard(text: str) -> Shard:
    """``K/N`` -> a :class:`Shard` (argparse's type: a bad spec is a usage error, exit 2)."""
    try:
        return Shard.parse(text)
    except ShardSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze", help="run the analyzer: L1 change points, L2 group scores, diagnosis",
        description="Read stage latencies from the store, find iteration-time change points (L1), "
                    "score ranks inside their parallel groups (L2), diagnose culprit ranks/node/class, "
                    "and write l1_changepoint, l2_kind, l2_group, l2_rank and incident points back. Runs every "
                    "--every interval (APScheduler; a failed cycle is logged and the next one runs), "
                    "or once with --once.")
    add_store_options(p)
    p.add_argument("--job", action="append", help="analyze only this job (repeatable; default: every job)")
    p.add_argument("--every", type=parse_interval, default=None, metavar="INTERVAL",
                   help="cycle interval, e.g. 30s, 2m (default 30s); not with --once")
    p.add_argument("--once", action="store_true", help="run one cycle over the stored data and exit")
    p.add_argument("--json", action="store_true", help="with --once: print {\"incidents\": [...]} as JSON")
    p.add_argument("--config", metavar="TOML",
                   help="thresholds ([analyzer] table) and stages ([stages] table); with --every the "
                        "file is reloaded when it changes (or on SIGHUP): an invalid file is refused "
                        "and the thresholds in force stay. Its [actions] table (mode \"dry-run\" or "
                        "\"enforce\"; read at start) runs the actor after each cycle, in the background "
                        "(docs/actions.md)")
    p.add_argument("--shard", type=parse_shard, default=None, metavar="K/N",
                   help=f"analyze only the jobs of shard K of N (env {SHARD_ENV}): those whose name's "
                        f"MD5 (last 8 bytes, big-endian) mod N is K, as Prometheus' hashmod; K in "
                        f"0..N-1, a StatefulSet's pod ordinal. N replicas with 0/N..N-1/N analyze "
                        f"every job once; two with the same K/N are a high-availability pair "
                        f"(docs/scaling.md)")
    p.add_argument("--heartbeat", metavar="FILE", default=os.environ.get("RANKSCOPE_HEARTBEAT"),
                   help="with --every: touch FILE at start and after every cycle, for a liveness "
                        "probe that checks its age (env RANKSCOPE_HEARTBEAT)")
    p.add_argument("--prometheus", metavar="URL", default=None,
                   help=f"a Prometheus holding NVIDIA dcgm-exporter's metrics (env {URL_ENV}, or [hardware] "
                        f"prometheus_url): each incident's culprit GPUs are checked against their own past and "
                        f"the job's other GPUs (clock-event reasons, clocks, temperature, power, XIDs, PCIe, "
                        f"NVLink); credentials from {AUTH_PREFIX}_TOKEN or {AUTH_PREFIX}_USERNAME/_PASSWORD")
    p.add_argument("--nvidia-smi-database", metavar="DB", default=None,
                   help="also read Telegraf's nvidia_smi points from this database of the store's InfluxDB "
                        "([hardware] nvidia_smi_database)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_stream_options(p)
    p.set_defaults(func=run)


def _once(svc: AnalyzerService, store, args: argparse.Namespace, after: AfterCycle | None = None) -> int:
    """One cycle over what is stored (then the actions, waited for); the incidents, as JSON or
    as an operator's briefing."""
    require_jobs(store, args.job)
    report = svc.cycle(final=True)
    if after is not None:
        after.kick()
        after.wait(ONCE_ACTIONS_S)
    incidents = svc.stored_incidents()
    if args.json:
        print(json.dumps({"incidents": [i.to_json() for i in incidents]}, indent=2))
    else:
        for job, n in report.iterations.items():
            print(f"{job}: analyzed {n} iteration(s)")
        for inc in incidents:
            print("\n".join(inc.briefing()))
        if svc.analyzers and not incidents:
            print("no incidents")
        print(f"read {report.read_s:.1f}s, analysis {report.analyze_s:.1f}s, write {report.write_s:.1f}s")
    if not svc.analyzers and svc.shard is not None and store.jobs():
        print(f"shard {svc.shard} owns none of the {len(store.jobs())} job(s) in {store!r}")
        return 0
    if not svc.analyzers:
        print(f"rankscope analyze: no stage_latency data in {store!r} (bucket {store.bucket!r}): "
              f"check --store and --bucket", file=sys.stderr)
        return 1
    return 0


def resolve_shard(args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> Shard | None:
    """``--shard``, else the environment's ``RANKSCOPE_SHARD`` (empty: none); a job named with
    ``--job`` must be in it. Raises :class:`ShardSpecError`, naming the value and the rule."""
    shard = args.shard
    text = env.get(SHARD_ENV, "").strip()
    if shard is None and text:
        try:
            shard = Shard.parse(text)
        except ShardSpecError as exc:
            raise ShardSpecError(f"{SHARD_ENV}: {exc}") from None
    outside = [j for j in args.job or [] if shard is not None and not shard.owns(j)]
    if outside:
        raise ShardSpecError("; ".join(f"job {j!r} is in shard {shard_of(j, shard.count)}/{shard.count}, "
                                       f"not in {shard}" for j in outside))
    return shard


def _heartbeat(scheduler: BaseScheduler, path: str) -> None:
    """Touch ``path`` now and after every cycle (failed ones too: the process is alive and
    cycling); a liveness probe restarts a replica whose file grew old (deploy/kubernetes/)."""
    from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED

    def touch(_event: object = None) -> None:
        try:
            Path(path).touch()
        except OSError as exc:
            log.warning("cannot touch the heartbeat file %s: %s", path, exc)

    touch()
    scheduler.add_listener(touch, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)


def _evidence(args: argparse.Namespace, store):
    """The hardware evidence of ``[hardware]``, ``--prometheus`` and the environment (read at start)."""
    table = dict(config_table(args.config, "hardware"))
    if getattr(args, "nvidia_smi_database", None):
        table["nvidia_smi_database"] = args.nvidia_smi_database
    settings = hardware_settings(table, os.environ, getattr(args, "prometheus", None))
    evidence = hardware_evidence(store, settings, os.environ)
    log.info("hardware evidence from %s", ", ".join(repr(s) for s in evidence.sources) or "no source")
    return evidence


def run(args: argparse.Namespace) -> int:
    try:
        shard = resolve_shard(args)
    except ShardSpecError as exc:   # a usage error, as argparse's own: exit 2, no traceback
        print(f"rankscope analyze: error: {exc}", file=sys.stderr)
        return 2
    if args.json and not args.once:
        raise ValueError("--json prints the result of one cycle: use it with --once")
    if args.once and args.every is not None:
        raise ValueError("--once runs one cycle and exits; --every runs cycles for ever: choose one")
    watcher = ConfigWatcher(args.config) if args.config and not args.once else None
    cfg, stages = (watcher.config, watcher.stages) if watcher else load_config(args.config)
    store = open_store(args.store, args.bucket, create=False)
    evidence = _evidence(args, store)
    stream = start_stream(args, store) if not args.once else None
    svc = AnalyzerService(store, cfg, stages, jobs=args.job, progress=not args.quiet and not args.json,
                          shard=shard, evidence=[evidence], stream=stream and stream.feed,
                          subscription=stream and stream.subscription)
    try:
        after = after_cycle(store, args.config)
    except ValueError:
        store.close()
        raise
    if args.once:
        try:
            return _once(svc, store, args, after)
        finally:
            if after is not None:
                after.close()
            store.close()
    every = args.every if args.every is not None else DEFAULT_EVERY_S
    scheduler = build_scheduler(svc, every, blocking=True, watcher=watcher, after=after)
    if args.heartbeat:
        _heartbeat(scheduler, args.heartbeat)
    if watcher is not None and hasattr(signal, "SIGHUP"):
        signal.signal(signal.SIGHUP, lambda *_: watcher.request())
    print(f"analyzing {store!r}{f' shard {shard}' if shard else ''} every {every:g}s (Ctrl-C to stop"
          + (f"; {args.config} is reloaded when it changes or on SIGHUP" if watcher else "") + ")",
          file=sys.stderr)
    try:
        scheduler.start()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        if stream is not None:
            stream.close()
        store.close()
    return 0


__all__ = ["build_scheduler", "parse_interval", "parse_shard", "register", "resolve_shard", "run",
           "safe_cycle"]
