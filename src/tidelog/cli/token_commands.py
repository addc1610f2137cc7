"""``tidelog token create``: a bearer token for a principal, its hash added to a tokens file.

The token goes to stdout alone, once (``TOKEN=$(tidelog token create ...)`` captures it); how to
use it goes to stderr. The file keeps only hashes (``tidelog.security.tokens``), so a token that
was not captured cannot be printed again: create another. No server is called: the server reads
the file at start and on SIGHUP.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidelog.cli.common import err, fail
from tidelog.security import TokensError, add_token

token_app = typer.Typer(
    help="Create bearer tokens for a server's tokens file.", no_args_is_help=True
)


@token_app.command("create")
def token_create(
    principal: Annotated[str, typer.Argument(help="who the token stands for (ACL principal)")],
    file: Annotated[
        Path,
        typer.Option(
            "--file", "-f", help="the server's tokens file (tokens_file); created 0600 if missing"
        ),
    ],
    scram: Annotated[
        bool,
        typer.Option(
            "--scram",
            help="also store SCRAM-SHA-256 keys derived from the token, for Kafka clients that "
            "log in with sasl.mechanism=SCRAM-SHA-256 (PLAIN needs only the hash)",
        ),
    ] = False,
) -> None:
    """Create a token for PRINCIPAL, add its hash to --file and print the token (only now)."""
    try:
        token = add_token(file, principal, scram=scram)
    except (TokensError, OSError) as error:
        fail(str(error))
    print(token, flush=True)
    kafka = (
        f"  Kafka clients: security.protocol=SASL_SSL, sasl.mechanism="
        f"{'SCRAM-SHA-256 or PLAIN' if scram else 'PLAIN'}, username {principal}, the token as "
        f"the password\n"
    )
    err.print(
        f"The token above stands for [bold]{principal}[/bold]; {file} holds only its hash"
        f"{' and keys derived from it' if scram else ''}, so this is the one time it is shown. "
        f"Hand it over as a secret, and use it over TLS:\n"
        f"  export TIDELOG_TOKEN=<token>\n"
        f"  tidelog stream list --server HOST:PORT --tls-ca ca.pem\n"
        f"{kafka}"
        f"A running server reads {file} again on SIGHUP (tokens_file).",
        highlight=False,
    )


__all__ = ["token_app"]
