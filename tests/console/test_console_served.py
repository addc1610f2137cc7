"""The console as ``tidelog serve`` serves it, with the server's security: over HTTPS with the
server's certificate (reloaded in place), signing in with the server's tokens, each page and
listing checked by the server's live ACL for the signed-in principal, its own client calling the
broker as the server, and its own port apart from /metrics.

One server per test, in this process (``Server``), on free loopback ports."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.cookiejar import CookieJar
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

from tidelog.api.credentials import ServerSecurity
from tidelog.api.http import PEER_CERTIFICATE as API_PEER_CERTIFICATE
from tidelog.api.http import ServerGate
from tidelog.api.server import Server
from tidelog.api.settings import load_settings
from tidelog.client import AsyncClient, ClientSettings
from tidelog.console import Gate, for_server
from tidelog.console.app import ServerSideGate
from tidelog.console.gate import PEER_CERTIFICATE
from tidelog.process import free_port
from tidelog.security import ClientTls
from tidelog.security.testca import Issued, issue, make_ca
from tidelog.security.tokens import add_token

T = TypeVar("T")

ACL = """
super_users = ["server"]

[[rule]]
effect = "allow"
principals = ["alice"]
operations = ["*"]
resources = ["*"]

[[rule]]
effect = "allow"
principals = ["bob"]
operations = ["subscribe"]
resources = ["stream:public*"]

# carol may use every cursor and see every group but alice's: never alice's group's positions
[[rule]]
effect = "allow"
principals = ["carol"]
operations = ["cursor", "subscribe", "describe"]
resources = ["cursor:*", "stream:*", "group:*"]

[[rule]]
effect = "deny"
principals = ["carol"]
operations = ["describe", "group"]
resources = ["group:alice.pg"]
"""


@dataclass
class Pki:
    directory: Path
    ca: Issued
    server: Issued
    tokens: Path
    acl: Path
    issued: dict[str, str] = field(default_factory=dict)
    """principal -> its token"""

    @classmethod
    def make(cls, directory: Path) -> Pki:
        ca = make_ca(directory / "pki")
        pki = cls(
            directory,
            ca,
            issue(ca, directory / "pki", "server"),
            directory / "tokens.toml",
            directory / "acl.toml",
        )
        for principal in ("alice", "bob", "carol"):
            pki.issued[principal] = add_token(pki.tokens, principal)
        pki.acl.write_text(ACL)
        return pki


@dataclass
class Visitor:
    """A browser of the console: its cookies, over HTTPS trusting the test CA."""

    base: str
    context: ssl.SSLContext
    jar: CookieJar = field(default_factory=CookieJar)

    def open(self, path: str, form: dict[str, str] | None = None) -> tuple[int, str, str]:
        opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.context),
            urllib.request.HTTPCookieProcessor(self.jar),
        )
        data = urlencode(form).encode() if form is not None else None
        try:
            with opener.open(f"{self.base}{path}", data=data, timeout=15) as answer:
                return answer.status, answer.url, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.url, error.read().decode()

    def sign_in(self, token: str) -> tuple[int, str, str]:
        _, _, page = self.open("/login")
        return self.open("/login", {"csrf": csrf_of(page), "token": token, "next": "/streams"})


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" (?:value|content)="([^"]+)"', page)
    assert found, "no CSRF token on the page"
    return found.group(1)


def shown_streams(page: str) -> set[str]:
    return set(re.findall(r'href="/streams/([^"/?]+)"', page))


@asynccontextmanager
async def serving(directory: Path, **settings: Any) -> AsyncIterator[Server]:
    server = Server(
        load_settings(data_dir=directory / "data", host="127.0.0.1", port=0, **settings),
        console=for_server,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def off_loop(call: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(call, *args)


def secured(pki: Pki, **more: Any) -> dict[str, Any]:
    return {
        "tls_cert": pki.server.cert,
        "tls_key": pki.server.key,
        "tls_ca": pki.ca.cert,
        "tokens_file": pki.tokens,
        "acl_file": pki.acl,
        "metrics_port": free_port(),
        **more,
    }


def test_the_servers_gate_is_the_consoles(tmp_path: Path) -> None:
    """``tidelog serve`` hands its console a ServerGate: it has what the console asks. With
    neither tokens nor an ACL (``make serve``), the console needs no login."""
    gate = ServerGate(ServerSecurity(load_settings(data_dir=tmp_path)), 9293)
    for protocol in (Gate, ServerSideGate):
        wanted = {n for n in dir(protocol) if not n.startswith("_")}
        assert all(hasattr(gate, n) for n in wanted), wanted - set(dir(gate))
    assert PEER_CERTIFICATE == API_PEER_CERTIFICATE
    assert not gate.login_required and not gate.accepts_tokens and not gate.secure
    assert gate.client_tls() == ClientTls()  # plaintext, no credentials


def test_a_signed_in_principal_sees_and_does_only_what_the_acl_lets_it(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path)

    async def scenario() -> None:
        async with serving(tmp_path, **secured(pki)) as server:
            alice_tls = ClientTls(ca=pki.ca.cert, token=pki.issued["alice"])
            async with AsyncClient(
                f"127.0.0.1:{server.port}", settings=ClientSettings(tls=alice_tls)
            ) as client:
                for name in ("public-news", "secret-payroll"):
                    await client.create_stream(name)
            context = ssl.create_default_context(cafile=str(pki.ca.cert))
            base = f"https://127.0.0.1:{server.metrics_port}"
            bob = Visitor(base, context)
            status, url, _ = await off_loop(bob.open, "/streams")
            assert url.endswith("/login?next=%2Fstreams")  # sent to sign in first
            status, _, page = await off_loop(bob.sign_in, "tdl_not-a-token")
            assert status == 401 and "Unknown token" in page
            status, url, page = await off_loop(bob.sign_in, pki.issued["bob"])
            # the console's own client reached the broker (as the server, a super-user) and
            # the listing shows bob only what the ACL lets him see
            assert status == 200 and url.endswith("/streams"), page
            assert shown_streams(page) == {"public-news"}
            assert ">bob<" in page
            status, _, page = await off_loop(bob.open, "/streams/secret-payroll/messages")
            assert status == 403 and "bob may not subscribe on stream" in page
            status, _, page = await off_loop(bob.open, "/streams/public-news/messages")
            assert status == 200
            # an action bob may not take is refused before the broker is asked
            form = {"stream": "public-news", "csrf": csrf_of(page), "confirmed": "yes"}
            status, _, page = await off_loop(bob.open, "/actions/delete", form)
            assert status == 403 and "bob may not delete" in page
            alice = Visitor(base, context)
            status, _, page = await off_loop(alice.sign_in, pki.issued["alice"])
            assert shown_streams(page) == {"public-news", "secret-payroll"}
            async with AsyncClient(
                f"127.0.0.1:{server.port}", settings=ClientSettings(tls=alice_tls)
            ) as client:
                assert "public-news" in [s.name for s in await client.list_streams()]

            # a reload (SIGHUP) applies at the next request: the new ACL lets bob see payroll,
            # and a tokens file without bob's token ends his session
            pki.acl.write_text(ACL.replace('"stream:public*"', '"stream:*"'))
            assert "ACL" in server.reload()
            status, _, page = await off_loop(bob.open, "/streams")
            assert shown_streams(page) == {"public-news", "secret-payroll"}
            pki.tokens.unlink()
            pki.issued["alice"] = add_token(pki.tokens, "alice")
            assert "tokens" in server.reload()
            _, url, _ = await off_loop(bob.open, "/streams")
            assert "/login" in url
            # alice's old token went with the file too; with her new one the pages load: the
            # console's own token survived the reload
            _, url, _ = await off_loop(alice.open, "/streams")
            assert "/login" in url
            status, _, page = await off_loop(alice.sign_in, pki.issued["alice"])
            assert status == 200 and "public-news" in shown_streams(page)

    asyncio.run(scenario())


def test_a_groups_positions_are_the_groups_in_the_consoles_actions_and_listings(
    tmp_path: Path,
) -> None:
    """The console asks the server's rule for a cursor: ``__group:alice.pg`` holds the group's
    positions, so carol's grant of every cursor neither moves them (the console calls the
    broker as the server, a super-user) nor shows them to her."""
    pki = Pki.make(tmp_path)

    async def scenario() -> None:
        async with serving(tmp_path, **secured(pki)) as server:
            alice_tls = ClientTls(ca=pki.ca.cert, token=pki.issued["alice"])
            async with AsyncClient(
                f"127.0.0.1:{server.port}", settings=ClientSettings(tls=alice_tls)
            ) as client:
                await client.create_stream("orders")
                for _ in range(5):
                    await client.publish("orders", b"x")
                await client.set_cursor("__group:alice.pg", "orders", 0, 3)
                await client.set_cursor("carol.c", "orders", 0, 2)
                context = ssl.create_default_context(cafile=str(pki.ca.cert))
                carol = Visitor(f"https://127.0.0.1:{server.metrics_port}", context)
                status, _, page = await off_loop(carol.sign_in, pki.issued["carol"])
                assert status == 200, page
                for path in ("/consumers", "/streams/orders"):
                    status, _, page = await off_loop(carol.open, path)
                    assert status == 200, page
                    assert "carol.c" in page and "alice.pg" not in page, path
                form = {
                    "csrf": csrf_of(page),
                    "cursor": "__group:alice.pg",
                    "stream": "orders",
                    "partition": "0",
                    "offset": "0",
                    "confirmed": "yes",
                }
                status, _, answer = await off_loop(carol.open, "/actions/set-cursor", form)
                assert status == 403 and "carol may not group on group" in answer, answer
                assert await client.fetch_cursor("__group:alice.pg", "orders", 0) == 3
                # her own cursors she moves
                mine = {**form, "cursor": "carol.c"}
                status, _, answer = await off_loop(carol.open, "/actions/set-cursor", mine)
                assert status == 200, answer
                assert await client.fetch_cursor("carol.c", "orders", 0) == 0

    asyncio.run(scenario())


def served_certificate(port: int, ca: Path) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


def test_the_http_port_serves_the_servers_certificate_and_a_reload_replaces_it(
    tmp_path: Path,
) -> None:
    pki = Pki.make(tmp_path)

    async def scenario() -> None:
        async with serving(tmp_path, **secured(pki)) as server:
            first = await off_loop(served_certificate, server.metrics_port, pki.ca.cert)
            assert first == ssl.PEM_cert_to_DER_cert(pki.server.cert.read_text())
            (tmp_path / "renewed").mkdir()
            renewed = issue(pki.ca, tmp_path / "renewed", "server")
            shutil.copyfile(renewed.cert, pki.server.cert)
            shutil.copyfile(renewed.key, pki.server.key)
            assert "certificates" in server.reload()
            second = await off_loop(served_certificate, server.metrics_port, pki.ca.cert)
            assert second != first
            assert second == ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
            # plain HTTP is not served on that port
            with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=10) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                assert b"tidelog_" not in s.recv(4096)

    asyncio.run(scenario())


def test_with_mutual_tls_the_client_certificate_names_the_visitor(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path)
    carol = issue(pki.ca, tmp_path / "pki", "carol")

    async def scenario() -> None:
        settings = secured(pki, tls_client_ca=pki.ca.cert, tokens_file=None)
        async with serving(tmp_path, **settings) as server:
            context = ssl.create_default_context(cafile=str(pki.ca.cert))
            context.load_cert_chain(carol.cert, carol.key)
            visitor = Visitor(f"https://127.0.0.1:{server.metrics_port}", context)
            status, url, page = await off_loop(visitor.open, "/streams")
            # no login: the certificate is carol's, whom the ACL grants nothing
            assert url.endswith("/streams") and ">carol<" in page
            assert status == 200 and shown_streams(page) == set()
            status, _, page = await off_loop(visitor.open, "/cluster")
            assert status == 403 and "carol may not admin" in page
            anonymous = Visitor(visitor.base, ssl.create_default_context(cafile=str(pki.ca.cert)))
            try:
                result: object = await off_loop(anonymous.open, "/streams")
            except (urllib.error.URLError, ssl.SSLError, ConnectionError) as error:
                result = error
            assert not isinstance(result, tuple), "served without a client certificate"

    asyncio.run(scenario())


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


def test_the_console_on_its_own_port_leaves_the_metrics_port_to_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        ports = {"metrics_port": free_port(), "console_port": free_port()}
        async with serving(tmp_path, **ports) as server:
            assert server.console_port == ports["console_port"]
            metrics = f"http://127.0.0.1:{server.metrics_port}"
            console = f"http://127.0.0.1:{server.console_port}"
            assert await off_loop(get, f"{metrics}/metrics") == 200
            assert await off_loop(get, f"{metrics}/streams") == 404
            assert await off_loop(get, f"{console}/streams") == 200
            assert await off_loop(get, f"{console}/metrics") == 404

    asyncio.run(scenario())


def test_the_server_says_at_start_what_keeps_its_console_from_serving(tmp_path: Path) -> None:
    pki = Pki.make(tmp_path)

    def warnings(**settings: Any) -> list[str]:
        loaded = load_settings(data_dir=tmp_path / "data", **settings)
        return ServerGate(ServerSecurity(loaded), 9293).warnings()

    assert warnings() == []
    assert warnings(**secured(pki)) == []  # "server" is a super-user of that ACL
    assert "can sign nobody in" in warnings(acl_file=pki.acl)[0]  # no TLS: no tokens, no certs
    pki.acl.write_text(ACL.replace('super_users = ["server"]', ""))
    (said,) = warnings(**secured(pki))
    assert "(server)" in said and "super_users" in said
