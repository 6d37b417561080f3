"""``rankscope store``: check the store and list what it holds."""

from __future__ import annotations

import argparse
import json

from rankscope.store import InfluxStore, open_store


def register(sub: argparse._SubParsersAction) -> None:
    from rankscope.cli import add_store_options

    p = sub.add_parser("store", help="check the store and list its jobs",
                       description="Connect to the configured store, report what kind it is "
                                   "(InfluxDB version and write API, or embedded file) and list its jobs.")
    add_store_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_store(args.store, args.bucket, create=False) as store:
        info: dict[str, object] = {"store": repr(store), "bucket": store.bucket}
        if isinstance(store, InfluxStore):
            info["version"] = store.ping()
            info["write_api"] = store.api
        info["jobs"] = store.jobs()
    if args.json:
        print(json.dumps(info))
    else:
        for k, v in info.items():
            print(f"{k}: {v}")
    return 0
