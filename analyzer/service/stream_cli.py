"""``rankscope analyze --stream [HOST:]PORT``: the stream path's options and its set-up.

The service listens for InfluxDB's subscription writes on ``HOST:PORT`` (``--stream``, env
``RANKSCOPE_STREAM_LISTEN``), subscribes the store's database to ``--stream-url`` (default
``http://HOST:PORT``: the address InfluxDB posts to, which must reach this process), and drops
the subscription on a clean exit. A listener off loopback needs credentials: basic auth from
``RANKSCOPE_STREAM_USER`` and ``RANKSCOPE_STREAM_PASSWORD`` (InfluxDB sends the user and
password of its subscription's URL); the token variable is for other senders. InfluxDB 1.x only:
2.x and 3.x have no subscriptions (the read path stays theirs; 3.x's processing engine is the way
to plan for one).
"""

from __future__ import annotations

import argparse
import os
import threading
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from analyzer.read.stream_feed import STREAM_ENV, StreamEndpoint, StreamFeed
from analyzer.read.subscription import Subscription
from rankscope.http_credentials import Credentials, check_exposure
from rankscope.http_intake import IntakeHTTPServer, make_server
from rankscope.store import Store

LISTEN_ENV = "RANKSCOPE_STREAM_LISTEN"


def add_stream_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stream", metavar="[HOST:]PORT", default=os.environ.get(LISTEN_ENV),
                   help="the stream path (InfluxDB 1.x): listen here for the database's writes, which a "
                        "subscription the analyzer makes forwards to it, and analyze them as they come "
                        "instead of reading them back (a start, a gap or lost points are read back); "
                        f"env {LISTEN_ENV}; credentials from {STREAM_ENV[1]}/{STREAM_ENV[2]}")
    p.add_argument("--stream-url", metavar="URL", default=None,
                   help="with --stream: the URL InfluxDB posts to (default http://HOST:PORT of --stream)")
    p.add_argument("--insecure-stream", action="store_true",
                   help="with --stream: listen off loopback without credentials (anyone could post points)")


@dataclass
class StreamSetup:
    """The running stream path: its feed, subscription and HTTP server."""

    feed: StreamFeed
    subscription: Subscription
    server: IntakeHTTPServer

    def close(self) -> None:
        """A clean exit: the subscription dropped, the listener closed."""
        self.subscription.drop()
        self.server.shutdown()
        self.server.server_close()


def listen_address(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (loopback by default)."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
        if not 0 <= number <= 65535:
            raise ValueError
    except ValueError:
        raise ValueError(f"--stream {text!r}: expected PORT or HOST:PORT") from None
    return host or "127.0.0.1", number


def start_stream(args: argparse.Namespace, store: Store, environ: Mapping[str, str] = os.environ
                 ) -> StreamSetup | None:
    """The stream path of ``--stream``, listening (None without ``--stream``)."""
    if not getattr(args, "stream", None):
        return None
    if getattr(store, "api", None) != "v1" or not hasattr(store, "query_raw"):
        raise ValueError("--stream needs InfluxDB 1.x (subscriptions); 2.x and 3.x have none: "
                         "leave it out, the read path serves them")
    host, port = listen_address(args.stream)
    creds = Credentials.from_env(environ, STREAM_ENV)
    check_exposure(host, creds, insecure=args.insecure_stream)
    feed = StreamFeed(store.bucket)
    server = make_server((host, port), StreamEndpoint(feed, creds))
    threading.Thread(target=server.serve_forever, name="stream", daemon=True).start()
    url = args.stream_url or f"http://{host}:{server.server_address[1]}"
    if creds.user is not None:   # the server sends these with every post (never logged)
        parts = urllib.parse.urlsplit(url)
        auth = f"{urllib.parse.quote(creds.user, safe='')}:{urllib.parse.quote(creds.password or '', safe='')}"
        url = urllib.parse.urlunsplit(parts._replace(netloc=f"{auth}@{parts.netloc.rsplit('@', 1)[-1]}"))
    sub = Subscription(store, feed, url)
    sub.ensure()
    return StreamSetup(feed, sub, server)
