"""The console's gate, request by request, without a broker: the Host allow-list, the headers,
the CSRF token of every action, signing in with a token, and the guard asked for the visitor's
principal before any call to the broker (the broker here is an address where nothing listens:
a page that called it would answer 503)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import pytest
from tests.console.asgitools import Answer, Browser

from tidelog.access import Access, Guard, Operation
from tidelog.console import ConsoleConfig, Gate, OpenGate, create_app
from tidelog.console.gate import PEER_CERTIFICATE, allowed_hosts, default_host_names

NOWHERE = "127.0.0.1:1"


class NoDeletes:
    def allows(self, identity: str, access: Access) -> bool:
        return access.operation not in (Operation.DELETE, Operation.ADMIN)


@dataclass
class TokenGate:
    """A server's gate as the console sees it: tokens, a login, a guard."""

    tokens: dict[str, str] = field(default_factory=lambda: {"tdl_alice": "alice"})
    guard: Guard = field(default_factory=lambda: Guard(NoDeletes()))
    secure: bool = False
    port: int = 9293
    host_names: tuple[str, ...] = ()
    bound_host: str = "127.0.0.1"
    login_required: bool = True
    accepts_tokens: bool = True

    def principal_of_token(self, token: str) -> str | None:
        return self.tokens.get(token)

    def principal_of_peer(self, certificate: Mapping[str, Any]) -> str | None:
        return dict(certificate.get("subjectAltName", ())).get("DNS")


def console(gate: Gate | None = None) -> Browser:
    return Browser(create_app(ConsoleConfig(NOWHERE), gate or OpenGate(port=9293)))


def csrf_of(answer: Answer) -> str:
    found = re.search(r'name="csrf" (?:value|content)="([^"]+)"', answer.body)
    assert found, "no CSRF field on the page"
    return found.group(1)


# -- the Host allow-list ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/streams", "/login", "/static/console.js", "/actions/delete"])
def test_a_host_not_allowed_is_refused_with_a_page_naming_the_setting(path: str) -> None:
    browser = console()
    browser.host = "evil.example:9293"
    answer = browser.get(path)
    assert answer.status == 421
    assert "console_hosts" in answer.body and "evil.example:9293" in answer.body
    assert answer.header("x-frame-options") == "DENY"


def test_the_default_names_are_loopback_and_the_bound_host_with_the_port() -> None:
    hosts = allowed_hosts(default_host_names("10.1.2.3"), 9293)
    assert hosts == {"localhost:9293", "127.0.0.1:9293", "[::1]:9293", "10.1.2.3:9293"}
    assert allowed_hosts(default_host_names("0.0.0.0"), 9293) == {
        "localhost:9293",
        "127.0.0.1:9293",
        "[::1]:9293",
    }
    assert "[fe80::1]:9293" in allowed_hosts(default_host_names("fe80::1"), 9293)
    # a name with its own port is kept; the scheme's default port may be left out
    assert allowed_hosts(["Console.Example", "proxy:8443"], 443, secure=True) == {
        "console.example:443",
        "console.example",
        "proxy:8443",
    }


def test_console_hosts_replace_the_defaults() -> None:
    browser = console(TokenGate(host_names=("console.example",), login_required=False))
    assert browser.get("/login").status == 421  # 127.0.0.1 is no longer served
    browser.host = "console.example:9293"
    assert browser.get("/login").status == 200


# -- headers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/login", "/static/console.css", "/no-such-page", "/cluster"])
def test_every_response_carries_the_security_headers(path: str) -> None:
    answer = console(TokenGate(login_required=False)).get(path)
    csp = answer.header("content-security-policy") or ""
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert answer.header("x-frame-options") == "DENY"
    assert answer.header("x-content-type-options") == "nosniff"
    assert answer.header("referrer-policy") == "same-origin"
    if path.startswith("/static/"):
        assert answer.header("cache-control") != "no-store"
    else:
        assert answer.all("cache-control") == ["no-store"]


def test_no_template_runs_inline_script_or_style() -> None:
    """What the Content-Security-Policy would refuse: inline scripts, handlers, styles."""
    from tidelog.console.app import HERE

    for template in (HERE / "templates").glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\ssrc=)", text), template.name
        assert not re.search(r"\son[a-z]+=|javascript:|<style|\sstyle=", text), template.name


# -- CSRF ------------------------------------------------------------------------------------------


def test_an_action_without_the_sessions_csrf_token_is_refused() -> None:
    browser = console()
    page = browser.get("/login")  # any page: the browser's session and its token
    form = {"stream": "orders", "confirmed": "yes"}
    missing = browser.post("/actions/delete", urlencode(form))
    wrong = browser.post("/actions/delete", urlencode({**form, "csrf": "x" * 43}))
    assert (missing.status, wrong.status) == (403, 403)
    assert "Reload the page" in missing.body
    # another browser's token is no better
    other = console()
    other_token = csrf_of(other.get("/login"))
    assert browser.post("/actions/delete", urlencode({**form, "csrf": other_token})).status == 403
    # the right one reaches the confirmation (no broker call before it is confirmed)
    confirm = browser.post("/actions/pause", urlencode({"stream": "orders", "csrf": csrf_of(page)}))
    assert confirm.status == 200 and "Pause every partition of &#39;orders&#39;" in confirm.body
    assert csrf_of(confirm) == csrf_of(page)


def test_a_post_from_another_origin_is_refused_even_with_the_token() -> None:
    browser = console()
    token = csrf_of(browser.get("/login"))
    form = urlencode({"stream": "orders", "csrf": token})
    assert browser.post("/actions/pause", form, origin="http://evil.example").status == 403
    assert browser.post("/actions/pause", form, origin="null").status == 403
    assert browser.post("/actions/pause", form, origin="http://127.0.0.1:9293").status == 200


def test_the_guard_refuses_an_action_for_the_visitors_principal_before_the_broker_is_called() -> (
    None
):
    browser = console(TokenGate(login_required=False))
    token = csrf_of(browser.get("/login"))
    answer = browser.post("/actions/delete", urlencode({"stream": "orders", "csrf": token}))
    assert answer.status == 403 and "may not delete on stream" in answer.body


# -- signing in ------------------------------------------------------------------------------------


def test_with_a_login_required_pages_send_to_the_login_and_actions_are_refused() -> None:
    browser = console(TokenGate())
    answer = browser.get("/streams/orders/messages?limit=5")
    assert answer.status == 303
    assert answer.header("location") == "/login?next=%2Fstreams%2Forders%2Fmessages%3Flimit%3D5"
    assert browser.post("/actions/delete", "stream=orders&confirmed=yes").status == 401
    assert browser.get("/static/console.js").status == 200  # the login page's assets


def test_a_wrong_token_is_refused_and_a_right_one_opens_a_new_session() -> None:
    browser = console(TokenGate())
    login = browser.get("/login?next=/cluster")
    before = dict(browser.cookies)
    form = {"csrf": csrf_of(login), "next": "/cluster"}
    wrong = browser.post("/login", urlencode({**form, "token": "tdl_mallory"}))
    assert wrong.status == 401 and "Unknown token" in wrong.body
    no_csrf = {"next": "/cluster", "token": "tdl_alice"}
    assert browser.post("/login", urlencode(no_csrf)).status == 403
    right = browser.post("/login", urlencode({**form, "token": "tdl_alice"}))
    assert right.status == 303 and right.header("location") == "/cluster"
    cookie = right.header("set-cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # served without TLS here
    assert browser.cookies != before  # a new id: a planted one is worth nothing
    # now the guard is asked for alice (its policy refuses the cluster page: no broker call)
    page = browser.get("/cluster")
    assert page.status == 403 and "alice may not admin on the cluster" in page.body


CROSS_SITE_LINK = {"sec_fetch_site": "cross-site", "sec_fetch_mode": "navigate"}


def test_a_request_from_another_site_never_replaces_the_signed_in_cookie() -> None:
    """Under SameSite=Lax a browser sends the cookie with a link followed from another site, but
    not with another site's form post or embedded request: a new session's cookie sent with
    those would sign the visitor out."""
    browser = console(TokenGate())
    login = browser.get("/login")
    browser.post("/login", urlencode({"csrf": csrf_of(login), "token": "tdl_alice"}))
    signed_in = dict(browser.cookies)
    browser.cookies.clear()  # what such a request carries
    post = browser.post(
        "/actions/delete",
        "stream=orders&confirmed=yes",
        origin="http://evil.example",
        sec_fetch_site="cross-site",
        sec_fetch_mode="navigate",
        sec_fetch_dest="document",
    )
    embedded = browser.get("/streams", sec_fetch_site="cross-site", sec_fetch_dest="image")
    assert post.status == 401 and post.header("set-cookie") is None
    assert embedded.status == 303 and embedded.header("set-cookie") is None
    # a link from another site: the browser sent its cookie, which still names alice
    browser.cookies.update(signed_in)
    page = browser.get("/cluster", **CROSS_SITE_LINK)
    assert page.status == 403 and "alice may not admin" in page.body
    # a first visit by such a link opens a session as any first visit does
    first = console(TokenGate()).get("/login", **CROSS_SITE_LINK)
    assert first.status == 200 and first.header("set-cookie")


def test_a_login_redirects_only_within_the_console() -> None:
    browser = console(TokenGate())
    for target in ("https://evil.example/", "//evil.example/", "/\\evil.example"):
        login = browser.get("/login")
        form = {"csrf": csrf_of(login), "next": target, "token": "tdl_alice"}
        answer = browser.post("/login", urlencode(form))
        assert answer.header("location") == "/streams", target
        browser.cookies.clear()


def test_under_tls_the_cookie_is_secure_and_host_only() -> None:
    browser = console(TokenGate(secure=True, port=443))
    browser.host, browser.scheme = "localhost", "https"
    login = browser.get("/login")
    opened = login.header("set-cookie") or ""
    assert opened.startswith("__Host-tidelog_console=") and "; Secure" in opened
    form = urlencode({"csrf": csrf_of(login), "token": "tdl_alice"})
    signed_in = browser.post("/login", form).header("set-cookie") or ""
    assert signed_in.startswith("__Host-tidelog_console=") and "; Secure" in signed_in


def test_a_revoked_token_ends_its_sessions_at_their_next_request() -> None:
    gate = TokenGate()
    browser = console(gate)
    login = browser.get("/login")
    browser.post("/login", urlencode({"csrf": csrf_of(login), "token": "tdl_alice"}))
    assert browser.get("/cluster").status == 403  # signed in: the guard answers
    gate.tokens.clear()  # a reload of the tokens file without alice's
    assert browser.get("/cluster").status == 303  # back to the login


def test_signing_out_ends_the_session() -> None:
    browser = console(TokenGate())
    login = browser.get("/login")
    browser.post("/login", urlencode({"csrf": csrf_of(login), "token": "tdl_alice"}))
    page = browser.get("/cluster")
    assert "Sign out" in page.body and 'id="principal"' in page.body
    assert browser.post("/logout", "").status == 403  # the form's token is needed here too
    out = browser.post("/logout", urlencode({"csrf": csrf_of(page)}))
    assert out.status == 303 and "Max-Age=0" in (out.header("set-cookie") or "")
    assert browser.get("/cluster").status == 303


def test_a_client_certificate_names_the_visitor_without_a_login() -> None:
    browser = console(TokenGate())
    browser.extensions[PEER_CERTIFICATE] = {"subjectAltName": (("DNS", "carol"),)}
    page = browser.get("/cluster")
    assert page.status == 403 and "carol may not admin on the cluster" in page.body


def test_a_server_without_tokens_says_so_on_the_login_page() -> None:
    browser = console(TokenGate(accepts_tokens=False, tokens={}))
    page = browser.get("/login")
    assert page.status == 200 and "takes no tokens" in page.body
    form = urlencode({"csrf": csrf_of(page), "token": "tdl_alice"})
    assert browser.post("/login", form).status == 401


# -- the size of a posted form ---------------------------------------------------------------------


def test_a_form_over_the_limit_is_refused_without_reading_it() -> None:
    """The login takes POSTs from visitors who have not signed in: a huge body must not be held
    in the server's memory. A declared one is refused before any of it is read."""
    browser = console(TokenGate())
    megabyte = b"x" * (1 << 20)
    answer, read = browser.post_chunks("/login", [megabyte] * 64, content_length=str(64 << 20))
    assert answer.status == 413 and "64 KiB" in answer.body
    assert read == 0


def test_a_chunked_form_is_read_only_up_to_the_limit() -> None:
    browser = console(TokenGate())
    answer, read = browser.post_chunks("/login", [b"x" * 16384] * 256)
    assert answer.status == 413
    assert read <= 65536 // 16384 + 1
    # under the limit the form is read (and then judged: here its CSRF token is missing)
    answer, read = browser.post_chunks("/login", [b"token=", b"x" * 60000])
    assert (answer.status, read) == (403, 2)
