"""The web console: streams, messages (newest first, merged across partitions), consumers, views
and replication in a browser.

An ASGI app (:func:`create_app`) that talks to brokers only through :mod:`tidelog.client`, so it
works the same inside ``tidelog serve`` (mounted at ``/`` on the metrics port) and on its own
against any server (``tidelog console --server HOST:PORT``, :func:`run`). Pages are rendered on
the server; the browser gets small assets served from this package (``static/``: htmx, uPlot,
no CDN). See docs/console.md.
"""

from tidelog.console.app import ConsoleConfig, create_app
from tidelog.console.standalone import run

__all__ = ["ConsoleConfig", "create_app", "run"]
