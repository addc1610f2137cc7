"""``/metrics`` with the server's credentials: anonymous scrapes refused when the server requires
credentials, a token over HTTPS naming the scraper, and only the samples of streams it may see;
with anonymous callers admitted, a bare scrape sees what ``anonymous`` may. Without security the
endpoint stays Prometheus' own (test_http_port.py)."""

from __future__ import annotations

import asyncio
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.security.pki import token_server

from tidelog.api.server import Server
from tidelog.client import AsyncClient, ClientSettings
from tidelog.process import free_port
from tidelog.security import ClientTls

ACL = """
super_users = ["server"]

[[rule]]
effect = "allow"
principals = ["scraper", "anonymous"]
operations = ["subscribe"]
resources = ["stream:public*"]
"""

Scrape = tuple[int, str]


def scrape(port: int, ca: Path, token: str | None) -> Scrape:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=15) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrapes(tmp_path: Path, *tokens_of: str | None, **settings: Any) -> list[Scrape]:
    """Serve with TLS, tokens and :data:`ACL`, create streams public.a and secret, and scrape as
    each of ``tokens_of`` (a principal whose token is made, "unknown" for a token the server
    does not know, None for no credentials)."""
    served = token_server(
        tmp_path,
        ACL,
        {"server", *(t for t in tokens_of if t not in (None, "unknown"))},
        metrics_port=free_port(),
        console=False,
        **settings,
    )
    admin, ca = served.tokens["server"], served.ca
    tokens = [
        None if who is None else "tdl_unknown" if who == "unknown" else served.tokens[who]
        for who in tokens_of
    ]

    async def scenario() -> list[Scrape]:
        server = Server(served.settings)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            tls = ClientTls(ca=ca, token=admin)
            async with AsyncClient(address, settings=ClientSettings(tls=tls)) as client:
                for stream in ("public.a", "secret"):
                    await client.create_stream(stream)
                    await client.publish(stream, b"x")
            port = server.metrics_port  # scraped from threads while the server serves
            return list(
                await asyncio.gather(
                    *(asyncio.to_thread(scrape, port, ca, token) for token in tokens)
                )
            )
        finally:
            await server.stop()

    return asyncio.run(scenario())


def test_a_scrape_needs_credentials_and_shows_only_the_streams_its_principal_may_see(
    tmp_path: Path,
) -> None:
    anonymous, unknown, limited, full = scrapes(tmp_path, None, "unknown", "scraper", "server")
    assert anonymous[0] == 401 and "requires credentials" in anonymous[1]
    assert unknown[0] == 401 and "unknown token" in unknown[1]
    assert limited[0] == 200
    assert 'stream="public.a"' in limited[1]
    assert 'stream="secret"' not in limited[1]
    assert full[0] == 200
    assert 'stream="secret"' in full[1] and 'stream="public.a"' in full[1]


def test_with_anonymous_callers_admitted_a_bare_scrape_sees_what_anonymous_may(
    tmp_path: Path,
) -> None:
    [(status, body)] = scrapes(tmp_path, None, allow_anonymous=True)
    assert status == 200
    assert 'stream="public.a"' in body
    assert 'stream="secret"' not in body
