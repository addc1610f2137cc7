"""A request to an ASGI app without a server or a network: what the gate's tests need."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: str

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k == name.lower()]


@dataclass
class Browser:
    """Sends requests to one app as a browser would, keeping its cookies."""

    app: Any
    host: str = "127.0.0.1:9293"
    scheme: str = "http"
    cookies: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)

    def get(self, path: str, **headers: str) -> Answer:
        return self.request("GET", path, b"", headers)

    def post(self, path: str, body: str, **headers: str) -> Answer:
        headers.setdefault("content_type", "application/x-www-form-urlencoded")
        return self.request("POST", path, body.encode(), headers)

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        return self.sent(method, path, [body], headers)[0]

    def post_chunks(self, path: str, chunks: Iterable[bytes], **headers: str) -> tuple[Answer, int]:
        """A POST whose body arrives in ``chunks`` (as a chunked upload does); with the number
        of chunks the app read."""
        headers.setdefault("content_type", "application/x-www-form-urlencoded")
        return self.sent("POST", path, chunks, headers)

    def sent(
        self, method: str, path: str, chunks: Iterable[bytes], headers: dict[str, str]
    ) -> tuple[Answer, int]:
        answer, read = asyncio.run(self._call(method, path, chunks, headers))
        for cookie in answer.all("set-cookie"):
            name, _, rest = cookie.partition("=")
            value = rest.split(";", 1)[0]
            if "Max-Age=0" in cookie:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return answer, read

    async def _call(
        self, method: str, path: str, chunks: Iterable[bytes], extra: dict[str, str]
    ) -> tuple[Answer, int]:
        target, _, query = path.partition("?")
        headers = [(b"host", self.host.encode())]
        if self.cookies:
            jar = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            headers.append((b"cookie", jar.encode()))
        headers += [(k.replace("_", "-").encode(), v.encode()) for k, v in extra.items()]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": self.scheme,
            "path": target,
            "raw_path": target.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 9293),
            "extensions": dict(self.extensions),
        }
        sent: list[dict[str, Any]] = []
        pending = iter(chunks)
        upcoming: bytes | None = next(pending, b"")
        read = 0

        async def receive() -> dict[str, Any]:
            nonlocal upcoming, read
            if upcoming is None:
                await asyncio.sleep(3600)
                return {"type": "http.disconnect"}
            chunk, upcoming = upcoming, next(pending, None)
            read += 1
            return {"type": "http.request", "body": chunk, "more_body": upcoming is not None}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await self.app(scope, receive, send)
        start = next(m for m in sent if m["type"] == "http.response.start")
        content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        answer = Answer(
            start["status"],
            [(k.decode().lower(), v.decode()) for k, v in start.get("headers", [])],
            content.decode("utf-8", "replace"),
        )
        return answer, read
