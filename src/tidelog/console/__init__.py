"""The web console: streams, messages (newest first, merged across partitions), consumers, views
and replication in a browser.

An ASGI app (:func:`create_app`) that talks to brokers only through :mod:`tidelog.client`, so it
works the same inside ``tidelog serve`` (mounted at ``/`` on the metrics port) and on its own
against any server (``tidelog console --server HOST:PORT``, :func:`run`). Pages are rendered on
the server; the browser gets small assets served from this package (``static/``: htmx, uPlot,
no CDN). See docs/console.md.
"""

from tidelog.console.app import CONSOLE_CLIENT_SETTINGS, ConsoleConfig, create_app, for_server
from tidelog.console.gate import Gate, OpenGate
from tidelog.console.standalone import run

__all__ = [
    "CONSOLE_CLIENT_SETTINGS",
    "ConsoleConfig",
    "Gate",
    "OpenGate",
    "create_app",
    "for_server",
    "run",
]
