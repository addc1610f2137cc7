"""What every ``tidelog`` command shares: the consoles, the ``--server`` option, the credential
options (:func:`client_command`), failing with one line, and a client connection that turns
server errors into that line.

Command modules (``app.py``, ``view_commands.py``) import this and nothing of each other's but what
``app.py`` registers, so the CLI has no import cycle.
"""

from __future__ import annotations

import base64
import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console, ConsoleDimensions

from tidelog.client import Client, ClientError, ClientSettings, ClientTls, TlsError

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


# -- credentials -----------------------------------------------------------------------------------

_CREDENTIALS = (
    (
        "tls_ca",
        Annotated[
            Path | None,
            typer.Option(
                "--tls-ca",
                envvar="TIDELOG_TLS_CA",
                help="PEM CA that signed the server's certificate: connect with TLS",
                rich_help_panel="Connection",
            ),
        ],
        None,
    ),
    (
        "tls_cert",
        Annotated[
            Path | None,
            typer.Option(
                "--tls-cert",
                envvar="TIDELOG_TLS_CERT",
                help="PEM client certificate (mutual TLS; with --tls-key)",
                rich_help_panel="Connection",
            ),
        ],
        None,
    ),
    (
        "tls_key",
        Annotated[
            Path | None,
            typer.Option(
                "--tls-key",
                envvar="TIDELOG_TLS_KEY",
                help="PEM private key of --tls-cert",
                rich_help_panel="Connection",
            ),
        ],
        None,
    ),
    (
        "tls_system",
        Annotated[
            bool,
            typer.Option(
                "--tls",
                help="connect with TLS, checking the server against the system's CAs",
                rich_help_panel="Connection",
            ),
        ],
        False,
    ),
    (
        "token",
        Annotated[
            str | None,
            typer.Option(
                "--token",
                envvar="TIDELOG_TOKEN",
                help="bearer token (`tidelog token create`); sent only over TLS. Prefer the "
                "variable: a flag shows in the process list",
                show_default=False,
                rich_help_panel="Connection",
            ),
        ],
        None,
    ),
)
"""The options every client command takes, as (parameter, annotation, default). Only their
names and the variables' names are ever printed (help, errors), never a value."""


PLAINTEXT = ClientTls()
"""What a command sees when it is called as a function rather than through typer."""


def credentials(
    tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, tls: bool, token: str | None
) -> ClientTls:
    """The options as one :class:`ClientTls`; a combination it refuses (a token without TLS, a
    certificate without its key) is bad usage: one line, exit code 2."""
    try:
        return ClientTls(ca=tls_ca, cert=tls_cert, key=tls_key, token=token or None, enabled=tls)
    except TlsError as error:
        fail(str(error), 2)


def client_command(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with the credential options (``_CREDENTIALS``) added to what typer sees, and
    handed to it as one ``credentials: ClientTls`` argument. One place declares them, so every
    client command takes the same options with the same variables."""
    signature = inspect.signature(command, eval_str=True)
    if "credentials" not in signature.parameters:
        raise TypeError(f"{command.__name__} takes no 'credentials' parameter")
    kept = [p for p in signature.parameters.values() if p.name != "credentials"]
    added = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        for name, kind, default in _CREDENTIALS
    ]

    @functools.wraps(command)
    def run(
        *args: Any,
        tls_ca: Path | None = None,
        tls_cert: Path | None = None,
        tls_key: Path | None = None,
        tls_system: bool = False,
        token: str | None = None,
        **kwargs: Any,
    ) -> None:
        given = credentials(tls_ca, tls_cert, tls_key, tls_system, token)
        command(*args, credentials=given, **kwargs)

    run.__signature__ = signature.replace(parameters=kept + added)  # type: ignore[attr-defined]
    run.__annotations__ = {
        **{p.name: p.annotation for p in kept},
        **{name: kind for name, kind, _ in _CREDENTIALS},
        "return": None,
    }
    return run


def connect(server: str, tls: ClientTls) -> Client:
    try:
        return Client(server, settings=ClientSettings(retry_budget_s=INTERACTIVE_RETRY_S, tls=tls))
    except TlsError as error:  # a file that cannot be read, or is not PEM
        fail(str(error), 2)


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

    def __init__(self, server: str, tls: ClientTls) -> None:
        self.server = server
        self.tls = tls
        self.client: Client | None = None

    def __enter__(self) -> Client:
        self.client = connect(self.server, self.tls)
        return self.client

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if self.client is not None:
            self.client.close()
        if isinstance(error, ClientError):
            fail(str(error))
