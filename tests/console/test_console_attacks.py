"""The console against the attacks a browser makes possible, in a real headless Chromium
(Debian's, `make chromium`) against a real ``tidelog serve``:

- DNS rebinding: Chromium resolves ``evil.example`` to 127.0.0.1 (``--host-resolver-rules``), as
  an attacker's DNS would once the page is loaded; the page's own script then has the console's
  address under the attacker's name, Host and Origin both ``evil.example``;
- framing: a page of another site frames the console to have it clicked through;
- cross-site request forgery: a page of another site posts an action's form;
- a server with tokens: nothing shows before signing in, and a wrong token is refused;
- the headers every response carries, and that no page trips its own Content-Security-Policy.

The attacker's pages are served from a loopback port under another name (``attacker.example``,
also mapped to 127.0.0.1): another origin and another site, on the same machine so that
Chromium's own Local Network Access checks (a public page may not reach a loopback address at
all) do not stand in for the console's."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from tests.console.browsertools import CHROMIUM, free_port
from tests.support.server import ServerProcess, served

from tidelog.client import Client, ClientSettings
from tidelog.security import ClientTls
from tidelog.security.testca import issue, make_ca
from tidelog.security.tokens import add_token

pytestmark = pytest.mark.slow

SECRET = "the-secret-value"


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Chromium for which evil.example is 127.0.0.1: a DNS-rebinding attacker's name."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make chromium` (Debian chromium and its driver)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--host-resolver-rules=MAP evil.example 127.0.0.1, MAP attacker.example 127.0.0.1",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def tab(chromium: Browser) -> Iterator[Page]:
    context = chromium.new_context(ignore_https_errors=True)
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, int]]:
    """A server as `make serve` runs it (no tokens, no ACL: no login), its console beside
    /metrics."""
    port = free_port()
    data = tmp_path_factory.mktemp("attacks") / "data"
    with served(data, "--metrics-port", str(port)) as process:
        yield process, port


def victim(process: ServerProcess, name: str) -> None:
    with Client(process.address) as client:
        client.create_stream(name)
        client.publish(name, SECRET.encode(), key=b"k")


def exists(process: ServerProcess, name: str) -> bool:
    with Client(process.address) as client:
        return name in [s.name for s in client.list_streams()]


class AttackerSite:
    """The attacker's web server: one page per path, on a free loopback port."""

    def __init__(self) -> None:
        self.pages: dict[str, str] = {}
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path, "not found").encode()
                self.send_response(200 if self.path in pages else 404)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://attacker.example:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def attacker() -> Iterator[AttackerSite]:
    site = AttackerSite()
    yield site
    site.close()


def test_a_dns_rebinding_page_can_neither_delete_nor_export(
    open_server: tuple[ServerProcess, int], tab: Page
) -> None:
    process, port = open_server
    victim(process, "rebound")
    rebound = f"http://evil.example:{port}"
    answer = tab.goto(f"{rebound}/streams")
    assert answer is not None and answer.status == 421
    expect(tab.locator(".problem")).to_contain_text("console_hosts")
    expect(tab.locator("body")).not_to_contain_text("rebound")
    # the attacker's script, same-origin with the console under the attacker's name: it reads a
    # page for its CSRF token, posts the delete, and reads the export
    result = tab.evaluate(
        """async () => {
          const form = {'content-type': 'application/x-www-form-urlencoded'};
          const page = await (await fetch('/streams/rebound')).text();
          const found = page.match(/name="csrf" (?:value|content)="([^"]+)"/);
          const csrf = found ? found[1] : '';
          const body = 'stream=rebound&confirmed=yes&csrf=' + encodeURIComponent(csrf);
          const deleted = await fetch('/actions/delete', {method: 'POST', headers: form, body});
          const exported = await fetch('/streams/rebound/export.jsonl');
          return [deleted.status, exported.status, await exported.text()];
        }"""
    )
    deleted, exported, text = result
    assert deleted == 421 and exported == 421, result
    assert SECRET not in text
    assert exists(process, "rebound")


def test_a_page_of_another_site_cannot_frame_the_console(
    open_server: tuple[ServerProcess, int], attacker: AttackerSite, tab: Page
) -> None:
    process, port = open_server
    victim(process, "framed")
    console = f"http://127.0.0.1:{port}"
    attacker.pages["/prize"] = (
        f'<h1>Win a prize</h1><iframe id="bait" src="{console}/streams/framed" '
        f'width="1200" height="900" style="opacity:0.01"></iframe>'
    )
    tab.goto(f"{attacker.url}/prize")
    frame = tab.frame_locator("#bait")
    tab.wait_for_timeout(1500)  # time for the frame to load, were it allowed to
    delete = frame.locator("form[action='/actions/delete'] button")
    assert delete.count() == 0, "the console rendered inside another site's frame"
    # the frame holds the browser's refusal, not the console
    assert [f.url for f in tab.frames][1:] == ["chrome-error://chromewebdata/"]
    expect(frame.locator("body")).not_to_contain_text("framed")
    assert exists(process, "framed")


def test_a_form_another_site_posts_is_refused(
    open_server: tuple[ServerProcess, int], attacker: AttackerSite, tab: Page
) -> None:
    process, port = open_server
    victim(process, "forged")
    console = f"http://127.0.0.1:{port}"
    tab.goto(f"{console}/streams")  # the visitor has the console open: its session exists
    attacker.pages["/cute-cats"] = (
        f'<form id="f" method="post" action="{console}/actions/delete">'
        f'<input name="stream" value="forged"><input name="confirmed" value="yes"></form>'
        f'<script>document.getElementById("f").submit()</script>'
    )
    with tab.expect_navigation(url=f"{console}/actions/delete"):
        tab.goto(f"{attacker.url}/cute-cats")
    expect(tab.locator(".problem h1")).to_have_text("Refused")
    assert exists(process, "forged")
    # a post that names no origin at all (not a browser's form) needs the token just the same
    answer = tab.request.post(
        f"{console}/actions/delete",
        form={"stream": "forged", "confirmed": "yes"},
        max_redirects=0,
    )
    assert answer.status == 403
    assert exists(process, "forged")


def test_every_page_carries_the_security_headers_and_keeps_to_its_policy(
    open_server: tuple[ServerProcess, int], tab: Page
) -> None:
    process, port = open_server
    victim(process, "headed")
    console = f"http://127.0.0.1:{port}"
    violations: list[str] = []
    tab.on(
        "console",
        lambda message: (
            violations.append(message.text)
            if "Content Security Policy" in message.text
            or "Content-Security-Policy" in message.text
            else None
        ),
    )
    for path in ("/streams", "/streams/headed", "/streams/headed/messages", "/consumers"):
        answer = tab.goto(f"{console}{path}")
        assert answer is not None and answer.status == 200, path
        headers = answer.all_headers()
        policy = headers.get("content-security-policy", "")
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
        assert headers.get("x-frame-options") == "DENY", path
        assert headers.get("x-content-type-options") == "nosniff", path
        assert headers.get("referrer-policy") == "same-origin", path
        assert headers.get("cache-control") == "no-store", path
    tab.goto(f"{console}/streams/headed")
    tab.wait_for_selector(".chart")  # the page's scripts ran (console.js, uPlot)
    assert violations == [], violations
    export = tab.request.get(f"{console}/streams/headed/export.jsonl")
    assert export.status == 200 and export.headers.get("cache-control") == "no-store"
    assert export.headers.get("x-content-type-options") == "nosniff"


@pytest.fixture(scope="module")
def secured_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServerProcess, int, dict[str, str]]]:
    """A server with TLS, tokens and an ACL: alice may do everything; the console's own client
    calls as the server (a super-user)."""
    directory = tmp_path_factory.mktemp("secured")
    ca = make_ca(directory / "pki")
    certificate = issue(ca, directory / "pki", "server")
    tokens_file = directory / "tokens.toml"
    tokens = {"alice": add_token(tokens_file, "alice")}
    acl = directory / "acl.toml"
    acl.write_text(
        'super_users = ["server"]\n[[rule]]\neffect = "allow"\nprincipals = ["alice"]\n'
        'operations = ["*"]\nresources = ["*"]\n'
    )
    env = {
        "TIDELOG_TLS_CERT": str(certificate.cert),
        "TIDELOG_TLS_KEY": str(certificate.key),
        "TIDELOG_TLS_CA": str(ca.cert),
        "TIDELOG_TOKENS_FILE": str(tokens_file),
        "TIDELOG_ACL_FILE": str(acl),
    }
    port = free_port()
    with served(directory / "data", "--metrics-port", str(port), env=env) as process:
        tls = ClientTls(ca=ca.cert, token=tokens["alice"])
        with Client(process.address, settings=ClientSettings(tls=tls)) as client:
            client.create_stream("ledger")
        yield process, port, tokens


def test_with_tokens_the_console_shows_nothing_before_signing_in(
    secured_server: tuple[ServerProcess, int, dict[str, str]], tab: Page
) -> None:
    _, port, tokens = secured_server
    console = f"https://127.0.0.1:{port}"
    tab.goto(f"{console}/streams/ledger")
    expect(tab).to_have_url(f"{console}/login?next=%2Fstreams%2Fledger")
    expect(tab.locator("body")).not_to_contain_text("ledger")
    export = tab.request.get(f"{console}/streams/ledger/export.jsonl", max_redirects=0)
    assert export.status == 303  # to the login, never the data
    tab.fill("input[name=token]", "tdl_" + "x" * 43)
    tab.click("button:has-text('Sign in')")
    expect(tab.locator("#failure")).to_contain_text("Unknown token")
    cookies = tab.context.cookies()
    assert all(c["name"] != "__Host-tidelog_console" or c["secure"] for c in cookies)
    tab.fill("input[name=token]", tokens["alice"])
    tab.click("button:has-text('Sign in')")
    expect(tab).to_have_url(f"{console}/streams/ledger")
    expect(tab.locator("h1")).to_contain_text("ledger")
    expect(tab.locator("#principal")).to_have_text("alice")
    session = next(c for c in tab.context.cookies() if c["name"] == "__Host-tidelog_console")
    assert session["httpOnly"] and session["secure"] and session["sameSite"] == "Lax"
    tab.click("button:has-text('Sign out')")
    expect(tab).to_have_url(f"{console}/login")
    tab.goto(f"{console}/streams")
    expect(tab).to_have_url(f"{console}/login?next=%2Fstreams")
    assert json.dumps(tab.context.cookies()).count("tidelog_console") <= 1


def test_another_sites_link_keeps_the_visitor_signed_in_and_its_form_signs_nobody_out(
    secured_server: tuple[ServerProcess, int, dict[str, str]], attacker: AttackerSite, tab: Page
) -> None:
    """A console link in a chat or a dashboard is a top-level navigation from another site: it
    must reach the page signed in. Another site's form post arrives without the cookie and must
    not replace it."""
    _, port, tokens = secured_server
    console = f"https://127.0.0.1:{port}"
    tab.goto(f"{console}/login")
    tab.fill("input[name=token]", tokens["alice"])
    tab.click("button:has-text('Sign in')")
    expect(tab.locator("#principal")).to_have_text("alice")
    attacker.pages["/chat"] = f'<a id="link" href="{console}/streams/ledger">the ledger</a>'
    tab.goto(f"{attacker.url}/chat")
    with tab.expect_navigation(url=f"{console}/streams/ledger"):
        tab.click("#link")
    expect(tab.locator("#principal")).to_have_text("alice")
    attacker.pages["/sign-out"] = (
        f'<form id="f" method="post" action="{console}/actions/pause">'
        f'<input name="stream" value="ledger"></form>'
        f'<script>document.getElementById("f").submit()</script>'
    )
    with tab.expect_navigation(url=f"{console}/actions/pause"):
        tab.goto(f"{attacker.url}/sign-out")
    expect(tab.locator(".problem h1")).to_have_text("Sign in first")
    tab.goto(f"{console}/streams")
    expect(tab).to_have_url(f"{console}/streams")
    expect(tab.locator("#principal")).to_have_text("alice")


def test_without_credentials_the_secured_consoles_port_refuses_plain_http(
    secured_server: tuple[ServerProcess, int, dict[str, str]], tab: Page
) -> None:
    _, port, _ = secured_server
    with pytest.raises(Exception, match=r"socket hang up|ECONNRESET|ERR_EMPTY_RESPONSE"):
        tab.request.get(f"http://127.0.0.1:{port}/streams", timeout=5_000)
