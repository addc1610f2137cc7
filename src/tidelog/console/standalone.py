"""``tidelog console``: the console on its own port, against any tidelog server.

It has no login of its own (it knows none of the server's tokens nor its ACL): it acts with the
credentials it was started with (``TIDELOG_TLS_CA``, ``TIDELOG_TLS_CERT``/``KEY``,
``TIDELOG_TOKEN``), for whoever reaches its port, and the server's ACL applies to that identity.
So it binds loopback by default; the gate still refuses other host names (DNS rebinding), framing
and forms from other sites (docs/security.md, "The console").
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

import uvicorn

from tidelog.console.app import ConsoleConfig, create_app
from tidelog.console.gate import OpenGate, default_host_names

DEFAULT_CONSOLE_HOST = "127.0.0.1"
DEFAULT_CONSOLE_PORT = 9294


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (0: a free port); ``OSError`` names the address."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as error:
        sock.close()
        raise OSError(
            error.errno,
            f"cannot serve the console on {host}:{port}: {error.strerror or error}; "
            f"choose another --host/--port",
        ) from None
    return sock


def run(
    config: ConsoleConfig,
    host: str = DEFAULT_CONSOLE_HOST,
    port: int = DEFAULT_CONSOLE_PORT,
    allow_hosts: Sequence[str] = (),
) -> None:
    """Serve the console for ``config.server`` on ``host:port`` until Ctrl-C or SIGTERM; prints
    the address it serves on (one line, flushed) once it is bound. ``allow_hosts``: the names
    it is served under besides the loopback names and ``host``."""
    sock = bind(host, port)
    server = config.server
    bound = int(sock.getsockname()[1])
    gate = OpenGate(port=bound, host_names=(*default_host_names(host), *allow_hosts))
    uvicorn_config = uvicorn.Config(
        create_app(config, gate),
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    print(
        f"tidelog console on http://{host}:{bound}/ for the server at {server}",
        flush=True,
    )
    uvicorn.Server(uvicorn_config).run(sockets=[sock])
