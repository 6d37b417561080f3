"""``rankscope events serve`` (the webhook receiver) and ``rankscope event add`` (one event from
a script or a runbook)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from events.payloads import DEFAULT_HOST_LABELS, from_rankscope
from events.receiver import EventReceiver, ReceiverConfig
from events.rows import DEFAULT_SEVERITY, FIRING, RESOLVED, events_frame, sourced
from rankscope import schema
from rankscope.cli import add_store_options
from rankscope.hostnames import matching_hosts
from rankscope.http_credentials import (
    PASSWORD_ENV,
    TOKEN_ENV,
    USER_ENV,
    Credentials,
    check_exposure,
)
from rankscope.store import Store, open_store
from rankscope.times import format_time, parse_time

log = logging.getLogger("events")

DEFAULT_LISTEN = "127.0.0.1:9095"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv4 address or host name) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535 or ":" in host:
        raise argparse.ArgumentTypeError(f"--listen {text!r}: expected HOST:PORT, "
                                         f"e.g. {DEFAULT_LISTEN}")
    return host, int(port)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``events serve`` and ``event add``."""
    events = sub.add_parser(
        "events", help="receive out-of-band events from Alertmanager and Grafana alerting",
        description="Out-of-band events from the monitoring you already run, written into the "
                    "event measurement where the analyzer judges them against the traces (see "
                    "docs/events.md).")
    events_sub = events.add_subparsers(dest="events_command", metavar="COMMAND", required=True)
    serve = events_sub.add_parser(
        "serve", help="the HTTP receiver: POST /alertmanager, /grafana, /events; GET /healthz",
        description=f"Receive Alertmanager webhooks (POST /alertmanager), Grafana alerting webhook "
                    f"contact points (POST /grafana) and rankscope's own JSON list (POST /events); "
                    f"each usable alert becomes one event point. When {TOKEN_ENV} is set, a POST "
                    f"may carry 'Authorization: Bearer <token>'; when {USER_ENV} and {PASSWORD_ENV} "
                    f"are, HTTP basic auth with them; with either set, nothing else gets in. "
                    f"Without credentials only a loopback --listen is allowed (or --insecure).")
    add_store_options(serve)
    serve.add_argument("--listen", type=parse_listen, default=parse_listen(DEFAULT_LISTEN),
                       metavar="HOST:PORT", help=f"address to listen on (default {DEFAULT_LISTEN}, "
                                                 f"loopback only)")
    serve.add_argument("--insecure", action="store_true",
                       help="accept posts from anyone on a non-loopback --listen without "
                            "credentials (refused otherwise)")
    serve.add_argument("--host-label", action="append", dest="host_labels", metavar="LABEL",
                       help=f"label naming the machine, in order of preference "
                            f"(repeatable; default {', '.join(DEFAULT_HOST_LABELS)}); "
                            f"a :port suffix is stripped")
    serve.add_argument("--job", help="tag every event with this job (default: none, cluster events "
                                     "matched to jobs by host)")
    serve.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                       help="largest request body accepted (default 1 MiB; larger: 413)")
    serve.set_defaults(func=run_serve)

    event = sub.add_parser("event", help="write one out-of-band event (scripts, runbooks)",
                           description="Write out-of-band events into the event measurement.")
    event_sub = event.add_subparsers(dest="event_command", metavar="COMMAND", required=True)
    add = event_sub.add_parser(
        "add", help="write one event",
        description="Write one event, e.g. rankscope event add --name 'server port down' "
                    "--host gpu-node-01294. A --resolved notice with the same name, host, time, "
                    "severity and source rewrites the firing event.")
    add_store_options(add)
    add.add_argument("--name", required=True, help="what happened, e.g. 'server port down'")
    add.add_argument("--host", required=True, help="the machine it happened on")
    add.add_argument("--time", help="when it started: 30m / 2h (that long ago), RFC 3339 "
                                    "(2026-07-08T09:30:00Z; no zone: UTC) or epoch milliseconds "
                                    "(default: now; with --resolved: the start of the firing event "
                                    "it resolves)")
    add.add_argument("--severity", default=DEFAULT_SEVERITY, help=f"default {DEFAULT_SEVERITY}")
    add.add_argument("--text", default="", help="free text (default: the name)")
    add.add_argument("--source", help="who reports it, stored as cli/SOURCE (default: cli)")
    add.add_argument("--job", help="the job it concerns (default: none, a cluster event matched "
                                   "by host)")
    add.add_argument("--resolved", action="store_true",
                     help="the event is over (ended now): rewrites the latest firing event of the "
                          "same name, host, severity, source and job")
    add.set_defaults(func=run_add)


def run_serve(args: argparse.Namespace) -> int:
    creds = Credentials.from_env(os.environ)
    check_exposure(args.listen[0], creds, args.insecure)   # before the store is opened
    config = ReceiverConfig(host_labels=tuple(args.host_labels or DEFAULT_HOST_LABELS),
                            job=args.job, token=creds.token, user=creds.user,
                            password=creds.password, insecure=args.insecure,
                            max_body_bytes=args.max_body)
    store = open_store(args.store, args.bucket)
    receiver = EventReceiver(store, args.listen, config)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)  # one line per payload is the receiver's output
    if not creds.required and args.insecure:
        log.warning("listening on %s without credentials (--insecure): anyone who reaches it can "
                    "write events", args.listen[0])
    if hasattr(signal, "SIGTERM") and threading.current_thread() is threading.main_thread():
        # stop like Ctrl-C (docker stop); shutdown() waits for serve_forever, so not in the handler
        signal.signal(signal.SIGTERM,
                      lambda *_: threading.Thread(target=receiver.server.shutdown).start())
    print(f"receiving events on {receiver.url} (POST {', '.join(receiver.paths)}) into {store!r}; "
          f"senders present: {creds.describe()}; "
          f"{'job ' + args.job if args.job else 'cluster events'} (Ctrl-C to stop)",
          file=sys.stderr)
    try:
        receiver.serve_forever()
    finally:
        store.close()
    return 0


def run_add(args: argparse.Namespace) -> int:
    now_ms = int(time.time() * 1000)
    item = {"name": args.name, "host": args.host, "severity": args.severity,
            "source": sourced("cli", args.source), "text": args.text}
    if args.time is not None:   # a person's command: "30m" and a zoneless time (UTC) are fine
        item["time"] = parse_time(args.time, "--time", now_ms=now_ms, assume_utc=True)
    if args.resolved:
        item["status"] = RESOLVED
    # an event only counts where the analyzer reads: a mistyped path is refused, not created
    with open_store(args.store, args.bucket, create=False) as store:
        if args.resolved and args.time is None:
            item["time"] = _firing_start(store, item, args.job)
        tr = from_rankscope([item], now_ms, origin=None)   # the source is cli/... already
        if not tr.ok:
            raise ValueError(tr.refused[0].reason)
        row = tr.rows[0]
        store.write_measurement(schema.EVENT, events_frame(tr.rows, args.job))
        hosts = store.hosts()
        print(f"event {row.name!r} on {row.host} at {format_time(row.time_ms)} ({row.status}) written "
              f"{'for job ' + args.job if args.job else 'as a cluster event'} to {store!r}")
    if hosts and not matching_hosts(row.host, hosts):
        print(f"warning: no job has reported host {row.host!r} (nor a short or full name of it); events "
              f"are matched to incidents by the host name the collectors report, case and domain "
              f"folded ({', '.join(hosts[:3])}{'' if len(hosts) <= 3 else ', ...'})", file=sys.stderr)
    return 0


def _firing_start(store: Store, item: dict[str, str], job: str | None) -> int:
    """The start of the latest firing event a ``--resolved`` notice without ``--time`` ends: the
    same name, host, severity, source and job (a notice rewrites the point with its time)."""
    where: dict[str, str | None] = {k: item[k].strip() for k in ("name", "host", "severity", "source")}
    if job is None:
        where["job"] = None
    found = store.read(schema.EVENT, job, where=where)
    firing = found[found["status"] == FIRING] if len(found) else found   # an empty read has no columns
    if not len(firing):
        scope = f"job {job}" if job else "cluster events"
        raise ValueError(f"no firing event {where['name']!r} on {where['host']} (severity "
                         f"{where['severity']}, source {where['source']}, {scope}) to resolve; "
                         f"give --time with its start to record a resolved event anyway")
    return int(firing["time"].max())
