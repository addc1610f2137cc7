"""``/metrics`` with the server's credentials: anonymous scrapes refused when the server requires
credentials, a token over HTTPS naming the scraper, and only the samples of streams it may see.
Without security the endpoint stays Prometheus' own (test_http_port.py)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.error
import urllib.request
from pathlib import Path

from tidelog.api.server import Server
from tidelog.api.settings import load_settings
from tidelog.client import AsyncClient, ClientSettings
from tidelog.security import ClientTls
from tidelog.security.testca import issue, make_ca
from tidelog.security.tokens import add_token

ACL = """
super_users = ["server"]

[[rule]]
effect = "allow"
principals = ["scraper"]
operations = ["subscribe"]
resources = ["stream:public*"]
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int, ca: Path, token: str | None) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=15) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_a_scrape_needs_credentials_and_shows_only_the_streams_its_principal_may_see(
    tmp_path: Path,
) -> None:
    ca = make_ca(tmp_path / "pki")
    server_cert = issue(ca, tmp_path / "pki", "server")
    tokens = tmp_path / "tokens.toml"
    scraper = add_token(tokens, "scraper")
    admin = add_token(tokens, "server")
    (tmp_path / "acl.toml").write_text(ACL)
    settings = load_settings(
        data_dir=tmp_path / "data",
        port=0,
        metrics_port=free_port(),
        console=False,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tokens_file=tokens,
        acl_file=tmp_path / "acl.toml",
    )

    async def with_scrapes() -> tuple[tuple[int, str], ...]:
        server = Server(settings)
        await server.start()
        try:
            address = f"127.0.0.1:{server.port}"
            tls = ClientTls(ca=ca.cert, token=admin)
            async with AsyncClient(address, settings=ClientSettings(tls=tls)) as client:
                for stream in ("public.a", "secret"):
                    await client.create_stream(stream)
                    await client.publish(stream, b"x")
            port = server.metrics_port  # scraped from threads while the server serves
            return await asyncio.gather(
                asyncio.to_thread(scrape, port, ca.cert, None),
                asyncio.to_thread(scrape, port, ca.cert, "tdl_not-a-token"),
                asyncio.to_thread(scrape, port, ca.cert, scraper),
                asyncio.to_thread(scrape, port, ca.cert, admin),
            )
        finally:
            await server.stop()

    (anonymous, unknown, limited, full) = asyncio.run(with_scrapes())
    assert anonymous[0] == 401 and "requires credentials" in anonymous[1]
    assert unknown[0] == 401 and "unknown token" in unknown[1]
    assert limited[0] == 200
    assert 'stream="public.a"' in limited[1]
    assert 'stream="secret"' not in limited[1]
    assert full[0] == 200
    assert 'stream="secret"' in full[1] and 'stream="public.a"' in full[1]


ANONYMOUS_ACL = """
super_users = ["server"]

[[rule]]
effect = "allow"
principals = ["anonymous"]
operations = ["subscribe"]
resources = ["stream:public*"]
"""


def test_with_anonymous_callers_admitted_a_bare_scrape_sees_what_anonymous_may(
    tmp_path: Path,
) -> None:
    ca = make_ca(tmp_path / "pki")
    server_cert = issue(ca, tmp_path / "pki", "server")
    tokens = tmp_path / "tokens.toml"
    admin = add_token(tokens, "server")
    (tmp_path / "acl.toml").write_text(ANONYMOUS_ACL)
    settings = load_settings(
        data_dir=tmp_path / "data",
        port=0,
        metrics_port=free_port(),
        console=False,
        tls_cert=server_cert.cert,
        tls_key=server_cert.key,
        tokens_file=tokens,
        acl_file=tmp_path / "acl.toml",
        allow_anonymous=True,
    )

    async def bare_scrape() -> tuple[int, str]:
        server = Server(settings)
        await server.start()
        try:
            tls = ClientTls(ca=ca.cert, token=admin)
            address = f"127.0.0.1:{server.port}"
            async with AsyncClient(address, settings=ClientSettings(tls=tls)) as client:
                for stream in ("public.a", "secret"):
                    await client.create_stream(stream)
            return await asyncio.to_thread(scrape, server.metrics_port, ca.cert, None)
        finally:
            await server.stop()

    status, body = asyncio.run(bare_scrape())
    assert status == 200
    assert 'stream="public.a"' in body
    assert 'stream="secret"' not in body
