"""The server's HTTP port (``metrics_port``): ``/metrics`` and, mounted at ``/``, the web console.

One ASGI app (Starlette routing) served by uvicorn on a thread of its own with its own event
loop, so a Prometheus scrape or a console page never runs on the broker's loop. The socket is
bound first (:meth:`HttpEndpoint.bind`), before anything else starts, so a port in use stops the
start at once with a message that names the setting; the app is served once the gRPC port is
known (:meth:`HttpEndpoint.start`), because the console reaches the broker through a client of
that port, like any other client. The api does not import the console (the layering forbids it):
whoever starts the server passes a factory that builds it (``tidelog serve`` does).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route

ASGIApp = Callable[..., Any]
ConsoleFactory = Callable[[str], Starlette]
"""gRPC address (host:port) -> the console's ASGI app for it."""

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


class _Asgi:
    """An ASGI callable as an object, so Starlette routes to it as an app (a plain function
    would be taken for a request handler)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def http_app(registry: CollectorRegistry, console: Starlette | None) -> Starlette:
    """``/metrics`` from ``registry``, and ``console`` (when given) at ``/``."""
    routes: list[BaseRoute] = [Route("/metrics", _Asgi(make_asgi_app(registry)))]
    if console is None:
        return Starlette(routes=routes)
    routes.append(Mount("/", app=console))
    # A mounted app's startup and shutdown do not run by themselves: the console's (its client,
    # its sampler) run as the port's.
    return Starlette(routes=routes, lifespan=console.router.lifespan_context)


class HttpEndpoint:
    """``bind``, then ``start`` once the gRPC port is known, then ``close``."""

    def __init__(self, registry: CollectorRegistry, console: ConsoleFactory | None) -> None:
        self.registry = registry
        self.console = console
        self.port = 0
        self._socket: socket.socket | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def bind(self, host: str, port: int) -> int:
        """Bind the port and return it. Raises ``OSError`` naming the address and the setting
        when it cannot be bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)
        except OSError as error:
            sock.close()
            raise OSError(
                error.errno,
                f"cannot serve metrics and the console on {host}:{port}: "
                f"{error.strerror or error}; choose another --metrics-port "
                f"(TIDELOG_METRICS_PORT, or metrics_port in the config file), or 0 to turn "
                f"metrics and the console off",
            ) from None
        sock.setblocking(False)
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        return self.port

    def start(self, grpc_address: str) -> None:
        """Serve the bound port on a thread; returns once it answers."""
        assert self._socket is not None, "bind first"
        console = self.console(grpc_address) if self.console is not None else None
        config = uvicorn.Config(
            http_app(self.registry, console),
            loop="asyncio",
            lifespan="on" if console is not None else "off",
            log_config=None,  # leave the server's logging as configured
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        server = uvicorn.Server(config)
        sockets = [self._socket]
        thread = threading.Thread(
            target=lambda: asyncio.run(server.serve(sockets=sockets)),
            name="tidelog-http",
            daemon=True,
        )
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._server, self._thread = server, thread
        if not server.started:
            self.close()
            raise OSError(f"the HTTP port {self.port} did not start serving")

    def close(self) -> None:
        """Stop serving and release the port (idempotent). A mounted app that set
        ``state.before_shutdown`` (the console: it ends its live tails) is told first, so open
        streams end by themselves rather than be cancelled after the grace time."""
        if self._server is not None:
            app = self._server.config.app
            for route in getattr(app, "routes", ()):
                state = getattr(getattr(route, "app", None), "state", None)
                hook = getattr(state, "before_shutdown", None)
                if callable(hook):
                    hook()
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
