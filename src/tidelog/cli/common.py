"""What every ``tidelog`` command shares: the consoles, the ``--server`` option, failing with
one line, and a client connection that turns server errors into that line.

Command modules (``app.py``, ``view_commands.py``) import this and nothing of each other's but what
``app.py`` registers, so the CLI has no import cycle.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, ConsoleDimensions

from tidelog.client import Client, ClientError, ClientSettings

PIPED_WIDTH = 1 << 30
"""The width of stdout when it is not a terminal: a table is as wide as its cells need, and wider
than any value it can hold (a message is at most 64 MiB)."""


class _Stdout(Console):
    """stdout: at a terminal, the terminal's width (a table fits it, folding or cutting cells);
    piped or redirected, ``PIPED_WIDTH``, so no table is cut. Rich's own fallback there is 80
    columns (or ``COLUMNS``), which cut the tables of every command to fit."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self.width, self.height = new_size


# soft_wrap: never break a line at the terminal width (messages stay one line in pipes and logs).
out = _Stdout(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

ServerOption = Annotated[
    str,
    typer.Option("--server", "-s", envvar="TIDELOG_SERVER", help="tidelog server host:port"),
]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


INTERACTIVE_RETRY_S = 2.0
"""How long a CLI command retries a server that is restarting before it says it cannot reach it
(the client's default, 10 s, is for programs; a person at a prompt wants the answer sooner)."""


def connect(server: str) -> Client:
    # TIDELOG_TLS_CA, TIDELOG_TLS_CERT, TIDELOG_TLS_KEY, TIDELOG_TOKEN (ClientSettings.from_env)
    return Client(server, settings=ClientSettings.from_env(retry_budget_s=INTERACTIVE_RETRY_S))


def printable(data: bytes | None) -> str | None:
    """Bytes as text: UTF-8 when they are, else ``base64:...``."""
    if data is None:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(data).decode()


class guarded:
    """A client connection that turns server errors into one printed line and exit code 1."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.client: Client | None = None

    def __enter__(self) -> Client:
        self.client = connect(self.server)
        return self.client

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if self.client is not None:
            self.client.close()
        if isinstance(error, ClientError):
            fail(str(error))
