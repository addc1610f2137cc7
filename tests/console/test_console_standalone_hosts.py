"""``tidelog console`` answers only its names: loopback, its --host and each --allow-host."""

from __future__ import annotations

import http.client

from tests.console.browsertools import Console, free_port


def status_for(url: str, host: str) -> tuple[int, str]:
    address = url.removeprefix("http://")
    name, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(name, int(port), timeout=10)
    try:
        connection.request("GET", "/static/console.css", headers={"Host": host})
        answer = connection.getresponse()
        return answer.status, answer.read().decode()
    finally:
        connection.close()


def test_the_standalone_console_refuses_names_it_was_not_given() -> None:
    console = Console(f"127.0.0.1:{free_port()}", "--allow-host", "console.example")
    try:
        port = console.url.rsplit(":", 1)[1]
        for allowed in (f"127.0.0.1:{port}", f"localhost:{port}", f"console.example:{port}"):
            assert status_for(console.url, allowed)[0] == 200, allowed
        status, page = status_for(console.url, f"evil.example:{port}")
        assert status == 421 and "--allow-host" in page
        assert status_for(console.url, "console.example:1")[0] == 421  # the port counts
    finally:
        console.kill()
