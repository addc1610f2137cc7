"""The client over TLS: ``ClientSettings.tls`` for every call, from code or from the environment
(``ClientSettings.from_env``); a token refused without TLS; and the site applications built on a
client (routing listener, snapshot provider) connecting as their client does."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.server import ServerProcess, served

from tidelog.client import (
    AsyncClient,
    ClientSettings,
    ClientTls,
    RoutedMessage,
    SnapshotRequest,
    TlsError,
    Unavailable,
    tls_from,
)
from tidelog.security.testca import issue, make_ca


@dataclass(frozen=True)
class Secured:
    server: ServerProcess
    tls: ClientTls
    """A client certificate the server's CA signed (principal ``app``)."""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A site server (sites on: snapshot requests exist) that requires client certificates."""
    pki = tmp_path_factory.mktemp("pki")
    ca = make_ca(pki)
    server_cert, app = issue(ca, pki, "server"), issue(ca, pki, "app")
    with served(
        tmp_path_factory.mktemp("mtls") / "data",
        *("--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)),
        *("--tls-client-ca", str(ca.cert), "--site-id", "here"),
    ) as process:
        yield Secured(process, ClientTls(ca=ca.cert, cert=app.cert, key=app.key))


def test_every_call_goes_over_mutual_tls(secured: Secured) -> None:
    asyncio.run(asyncio.wait_for(_calls_over_tls(secured), 60))


async def _calls_over_tls(secured: Secured) -> None:
    settings = ClientSettings(tls=secured.tls)
    async with AsyncClient(secured.server.address, settings=settings) as client:
        await client.create_stream("secure")
        acks = await client.publish_batch("secure", [b"a", b"b"])
        assert [ack.offset for ack in acks] == [0, 1]
        got = [m.value async for m in client.subscribe("secure", 0, start="earliest", stop=1)]
        assert got == [b"a", b"b"]
        await client.set_cursor("c", "secure", 0, 1)
        assert await client.fetch_cursor("c", "secure", 0) == 1
    plaintext = ClientSettings(retry_budget_s=0.5)
    async with AsyncClient(secured.server.address, settings=plaintext) as client:
        with pytest.raises(Unavailable):
            await client.list_streams()


def test_from_env_reads_the_tls_variables(
    monkeypatch: pytest.MonkeyPatch, secured: Secured
) -> None:
    tls = secured.tls
    monkeypatch.setenv("TIDELOG_TLS_CA", str(tls.ca))
    monkeypatch.setenv("TIDELOG_TLS_CERT", str(tls.cert))
    monkeypatch.setenv("TIDELOG_TLS_KEY", str(tls.key))
    monkeypatch.setenv("TIDELOG_TOKEN", "tdl_from-the-env")
    settings = ClientSettings.from_env(retry_budget_s=1.0)
    assert settings.tls == ClientTls(tls.ca, tls.cert, tls.key, token="tdl_from-the-env")
    assert settings.retry_budget_s == 1.0
    assert "tdl_from-the-env" not in repr(settings)  # settings get logged; tokens must not


def test_a_token_without_tls_is_refused_before_any_connection(tmp_path: Path) -> None:
    with pytest.raises(TlsError, match="a token is sent only over TLS") as refused:
        tls_from(token="tdl_secret")
    assert "tdl_secret" not in str(refused.value)
    with pytest.raises(TlsError, match="a token is sent only over TLS"):
        tls_from(environ={"TIDELOG_TOKEN": "tdl_secret"})
    assert tls_from(token="tdl_secret", ca=tmp_path / "ca.pem").secure


def test_the_site_applications_connect_as_their_client_does(secured: Secured) -> None:
    """The routing listener and the snapshot provider make every call through the client they
    were built from, so they use its TLS settings: they run against this server with the
    client's certificate, and fail to reach it with a plaintext client."""
    asyncio.run(asyncio.wait_for(_site_applications(secured), 60))


async def _site_applications(secured: Secured) -> None:
    delivered: list[RoutedMessage] = []

    def provide(request: SnapshotRequest) -> list[tuple[str, bytes]]:
        return []

    settings = ClientSettings(tls=secured.tls)
    async with AsyncClient(secured.server.address, settings=settings) as client:
        listener = client.routing_listener("app", delivered.append, discover_s=0.05)
        provider = client.snapshot_provider(provide)
        running = [asyncio.create_task(listener.run()), asyncio.create_task(provider.run())]
        await asyncio.sleep(0.5)  # a few rounds of discovery, the provider subscribed
        assert not any(task.done() for task in running), [t.exception() for t in running]
        listener.stop()
        provider.stop()
        await asyncio.wait_for(asyncio.gather(*running), 10)
        assert delivered == []
    plaintext = ClientSettings(retry_budget_s=0.5)
    async with AsyncClient(secured.server.address, settings=plaintext) as client:
        with pytest.raises(Unavailable):
            await client.routing_listener("app", delivered.append).run()
        with pytest.raises(Unavailable):
            await client.snapshot_provider(provide).run()
