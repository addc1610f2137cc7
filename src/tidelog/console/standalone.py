"""``tidelog console``: the console on its own port, against any tidelog server."""

from __future__ import annotations

import socket

import uvicorn

from tidelog.console.app import ConsoleConfig, create_app

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
    config: ConsoleConfig, host: str = DEFAULT_CONSOLE_HOST, port: int = DEFAULT_CONSOLE_PORT
) -> None:
    """Serve the console for ``config.server`` on ``host:port`` until Ctrl-C or SIGTERM; prints
    the address it serves on (one line, flushed) once it is bound."""
    sock = bind(host, port)
    server = config.server
    uvicorn_config = uvicorn.Config(
        create_app(config),
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    print(
        f"tidelog console on http://{host}:{sock.getsockname()[1]}/ for the server at {server}",
        flush=True,
    )
    uvicorn.Server(uvicorn_config).run(sockets=[sock])
