"""``rankscope dashboards generate|check``: dashboards and provisioning files from code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboards import provisioning


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards", help="generate or check the Grafana dashboards, data source and alert rules",
        description="The Grafana dashboards (grafanalib code in dashboards/*.py), the data source, "
                    "the dashboard provider and the alert rules are generated into dashboards/generated/ "
                    "and dashboards/provisioning/ and committed; Grafana provisions them from there.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, helptext in (("generate", "write the generated files (removing stale ones)"),
                           ("check", "exit 1 when the committed files differ from what the code generates")):
        a = actions.add_parser(name, help=helptext, description=helptext)
        a.add_argument("--root", type=Path, default=provisioning.PACKAGE_DIR,
                       help="folder holding generated/ and provisioning/ (default: the dashboards package)")
        a.set_defaults(func=run_generate if name == "generate" else run_check)


def run_generate(args: argparse.Namespace) -> int:
    paths = provisioning.write_all(args.root)
    print(f"wrote {len(paths)} files under {args.root}", file=sys.stderr)
    for p in paths:
        print(p)
    return 0


def run_check(args: argparse.Namespace) -> int:
    drift = provisioning.check(args.root)
    if drift:
        for d in drift:
            print(f"rankscope dashboards check: {d}", file=sys.stderr)
        print("run `rankscope dashboards generate` and commit the result", file=sys.stderr)
        return 1
    print(f"dashboards check: {len(provisioning.render_all())} generated files in sync", file=sys.stderr)
    return 0
