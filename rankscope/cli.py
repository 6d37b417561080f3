"""The ``rankscope`` command line.

Each command lives next to what it drives (collector/, simulator/, analyzer/,
dashboards/, evaluation/) and is declared in pyproject.toml as an entry point of
the group ``rankscope.commands``: ``name = "package.module:register"``, where
``register(subparsers)`` adds the subcommand. The core finds them through the
installed package's metadata, so it names no component and imports none.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import TYPE_CHECKING

from rankscope import __version__
from rankscope.config import DEFAULT_BUCKET, DEFAULT_STORE

if TYPE_CHECKING:
    from rankscope.store import Store

#: The entry-point group through which components add their subcommands.
COMMAND_GROUP = "rankscope.commands"


def add_store_options(parser: argparse.ArgumentParser, default_store: str = DEFAULT_STORE) -> None:
    """``--store`` and ``--bucket``, shared by every command that touches data (``default_store``:
    what the command's help names as the default when it has its own, as the demo does)."""
    parser.add_argument(
        "--store", metavar="URL|PATH", default=None,
        help=f"http(s):// URL of an InfluxDB server, or the path of an embedded store "
             f"(env RANKSCOPE_STORE; default {default_store}). Credentials come from the "
             f"environment: INFLUXDB_V2_TOKEN/INFLUXDB_V2_ORG (2.x, 3.x) or "
             f"INFLUXDB_V1_USERNAME/INFLUXDB_V1_PASSWORD (1.x).")
    parser.add_argument(
        "--bucket", default=None,
        help=f"bucket on InfluxDB 2.x/3.x, database on 1.x, created on 1.x when missing "
             f"(env RANKSCOPE_BUCKET; default {DEFAULT_BUCKET})")


def require_jobs(store: Store, jobs: Iterable[str] | None, known: list[str] | None = None) -> None:
    """Refuse job names the store has no ``stage_latency`` for (or none of ``known``, when the
    command reads other points), listing the ones it has (a typo should not read as "nothing
    happened")."""
    if not jobs:
        return
    known = store.jobs() if known is None else known
    missing = [j for j in jobs if j not in known]
    if missing:
        raise ValueError(f"no job {', '.join(map(repr, missing))} in {store!r}; jobs there: "
                         f"{', '.join(known) or 'none'}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rankscope",
        description="Fail-slow diagnosis for large distributed training jobs: collect per-rank, "
                    "per-stage latencies, find iteration-time change points (L1), compare ranks "
                    "inside parallel groups (L2), and name the culprit ranks, node and fault class.",
    )
    parser.add_argument("--version", action="version", version=f"rankscope {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name)
    if not commands:
        raise RuntimeError(f"no rankscope commands are installed (entry points {COMMAND_GROUP!r}); "
                           f"install the package: pip install -e .")
    for ep in commands:
        ep.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"rankscope {args.command}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
