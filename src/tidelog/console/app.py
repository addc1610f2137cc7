"""The console's ASGI app: server-rendered pages over one :class:`~tidelog.client.AsyncClient`.

Every page is HTML rendered here (Jinja2); the browser gets small, locally served assets: htmx
(boosted links and forms: a page change swaps the body without a reload), uPlot (the lag and
rate charts) and ``console.js`` (the live tail's EventSource, the charts). Everything works with
scripts off except the live tail and the charts.

The console talks to brokers only through the client. Every request first passes the gate
(``gate.py``: the ``Host`` allow-list, the visitor's session or login, the security headers);
every page and action is then checked by the server's guard for the visitor's principal
(:data:`PAGE_ACCESS`, :data:`ACTION_ACCESS`) before any call to the broker, and a listing shows
only what that principal may see. Admin actions are POSTs that first answer a confirmation page;
only a POST carrying the session's CSRF token, ``confirmed=yes`` and (when the browser sends one)
an ``Origin`` that is this console acts. A failure a person can act on (unknown stream, server
unreachable, a search that ran out of budget, a bad filter) is a page saying what happened and
what to do, never a traceback; anything else is logged and answered with a short apology.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit

import grpc
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from tidelog.access import Access, Guard, Kind, Operation, Resource, cursor_access, on
from tidelog.client import (
    AlreadyExists,
    AsyncClient,
    ClientError,
    ClientSettings,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from tidelog.console import render
from tidelog.console.brokers import BrokerMemory
from tidelog.console.gate import (
    LOGIN_PATH,
    Gate,
    GateMiddleware,
    Keeper,
    OpenGate,
    principal_of,
    session_of,
)
from tidelog.console.history import ConsumerState
from tidelog.console.messages import (
    TAIL_POLL_S,
    NoSuchOffset,
    Page,
    Position,
    TailStep,
    format_position,
    message_at,
    parse_position,
    position,
    read_newer,
    read_page,
    tail,
)
from tidelog.console.query import (
    SEARCH_BOUND,
    SEARCH_STEPS,
    BadQuery,
    MessageQuery,
    int_field,
    parse_bytes,
    parse_time,
)
from tidelog.console.sampler import (
    DEFAULT_SAMPLE_INTERVAL_S,
    DEFAULT_STALL_AFTER_S,
    Sampler,
    group_lag,
    newest_offsets,
    position_groups,
    stream_total,
)
from tidelog.console.sessions import Via, csrf_matches
from tidelog.errors import PermissionDenied

LOG = logging.getLogger("tidelog.console")
HERE = Path(__file__).parent

CONSOLE_CLIENT_SETTINGS = ClientSettings(retry_budget_s=3.0, connect_timeout_s=3.0)
"""A page answers within seconds when the server is down: a short retry budget."""
CLUSTER_MODE_TTL_S = 60.0
"""How long the console trusts its answer to "is the server part of a cluster?"."""
CURSOR_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,4096}")
"""A tail's cursor as the server's continuation tokens are written (base64url, no padding)."""
NOT_CLUSTERED_FOR_NOW = frozenset(
    {
        grpc.StatusCode.PERMISSION_DENIED,  # the console's principal may not ask
        grpc.StatusCode.UNIMPLEMENTED,  # a server without the call
        grpc.StatusCode.UNAVAILABLE,  # down or timed out: the page would wait again each load
    }
)
"""Answers to "is the server part of a cluster?" taken as "no" until the TTL runs out."""
VIEW_MAX_COUNT = 1000
"""The most values a window view's page asks for."""


@dataclass
class ConsoleConfig:
    server: str
    """the tidelog server's gRPC address, HOST:PORT"""
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    stall_after_s: float = DEFAULT_STALL_AFTER_S
    tail_poll_s: float = TAIL_POLL_S
    client: ClientSettings = CONSOLE_CLIENT_SETTINGS
    """how the console's client reaches the server (its TLS and credentials: docs/security.md)"""


class Console:
    """The app's state: the client and the sampler (created on the server's event loop)."""

    def __init__(self, config: ConsoleConfig, gate: Gate) -> None:
        self.config = config
        self.gate = gate
        self.keeper = Keeper(gate)
        self._client: AsyncClient | None = None
        self._sampler: Sampler | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closing = asyncio.Event()
        """Set when the port is about to stop: live tails end so the shutdown need not wait."""
        self.brokers = BrokerMemory()
        """the brokers the cluster page has seen (a killed one stays, shown down)"""
        self._cluster_mode: tuple[float, bool] | None = None

    async def in_cluster(self) -> bool:
        """Whether the server is a broker of a cluster (asked at most every
        :data:`CLUSTER_MODE_TTL_S`): a single broker's pages show no leadership."""
        now = time.monotonic()
        if self._cluster_mode is None or now - self._cluster_mode[0] > CLUSTER_MODE_TTL_S:
            try:
                await self.client.cluster_status(stream="\0", timeout=3.0)
                clustered = True
            except FailedPrecondition:
                clustered = False
            except ClientError as error:
                if error.code not in NOT_CLUSTERED_FOR_NOW:
                    return False  # cannot tell now: show no leadership, ask again next time
                clustered = False  # asked again after the TTL, not on every page (3 s each)
            self._cluster_mode = (now, clustered)
        return self._cluster_mode[1]

    def request_close(self) -> None:
        """End the live tails; callable from any thread (the server's, before it stops the
        port)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.closing.set)

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(self.config.server, settings=self.config.client)
        return self._client

    @property
    def guard(self) -> Guard:
        """The server's guard as it is now: checks each page and action (``PAGE_ACCESS``,
        ``ACTION_ACCESS``) and filters the listings."""
        return self.gate.guard

    def may_see(self, request: Request, kind: Kind, name: str) -> bool:
        return self.guard.may_see(principal_of(request), Resource(kind, name))

    def may_see_cursor(self, request: Request, cursor_id: str) -> bool:
        """Whether a listing shows the visitor this cursor: a group's positions by the group's
        visibility, as the server's rule says (:func:`tidelog.access.cursor_access`)."""
        return self.guard.may_see(principal_of(request), cursor_access(cursor_id).resource)

    @property
    def sampler(self) -> Sampler:
        if self._sampler is None:
            self._sampler = Sampler(
                self.client,
                interval_s=self.config.sample_interval_s,
                stall_after_s=self.config.stall_after_s,
            )
        return self._sampler

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self.sampler.run())
        try:
            yield
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            if self._client is not None:
                await self._client.close()
                self._client = None


# -- templates -----------------------------------------------------------------------------------


def _environment() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ns"] = render.format_ns
    env.filters["printable"] = render.printable
    env.filters["filter_form"] = render.filter_form
    env.tests["binary"] = render.is_binary
    env.globals["cell"] = render.cell
    env.globals["site_advice"] = render.site_advice
    env.filters["bytes"] = render.format_bytes
    env.filters["duration"] = render.format_duration
    env.globals["preview"] = render.preview
    env.globals["sparkline"] = render.sparkline_points
    env.globals["position"] = lambda m: format_position(position(m))
    return env


templates = Jinja2Templates(env=_environment())


def page(
    request: Request, name: str, context: dict[str, Any], status_code: int = 200
) -> HTMLResponse:
    console: Console = request.app.state.console
    session = session_of(request)
    base = {
        "server": console.config.server,
        "active": name.removesuffix(".html"),
        "csrf": session.csrf if session is not None else "",
        "principal": session.principal if session is not None else None,
        "signed_in": session is not None and session.via is Via.TOKEN,
        "accepts_tokens": console.gate.accepts_tokens,
    }
    return templates.TemplateResponse(request, name, {**base, **context}, status_code=status_code)


# -- errors --------------------------------------------------------------------------------------


def problem(request: Request, status: int, title: str, detail: str) -> HTMLResponse:
    return page(request, "error.html", {"title": title, "detail": detail}, status_code=status)


def refuse(request: Request, status: int, title: str, detail: str) -> Response:
    """The gate's refusals (a ``Host`` not served, no sign-in), on the console's error page."""
    return problem(request, status, title, detail)


async def on_not_found(request: Request, error: Exception) -> Response:
    return problem(
        request, 404, "Not found", f"{error} — check the name, or pick it from the streams page."
    )


async def on_unavailable(request: Request, error: Exception) -> Response:
    server = request.app.state.console.config.server
    return problem(
        request,
        503,
        "The tidelog server cannot be reached",
        f"The console could not reach {server}: {error}. Check that the server is running "
        f"and that this address is right (tidelog console --server HOST:PORT); then reload.",
    )


async def on_bad_request(request: Request, error: Exception) -> Response:
    return problem(request, 400, "That request cannot be answered", str(error))


async def on_client_error(request: Request, error: Exception) -> Response:
    return problem(request, 409, "The server refused", str(error))


async def on_http(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    title = HTTPStatus(error.status_code).phrase.capitalize()
    detail = str(error.detail)
    if error.status_code == 405:
        detail = (
            f"{request.url.path} is a page to open, not a form to send: it does not take a "
            f"{request.method} request."
        )
    return problem(request, error.status_code, title, detail)


async def on_bug(request: Request, error: Exception) -> Response:
    LOG.exception("console: %s %s failed", request.method, request.url.path, exc_info=error)
    return problem(
        request,
        500,
        "Something went wrong in the console",
        "The console hit an unexpected error; it has been logged on the console's side. "
        "Reload to try again.",
    )


# -- pages ---------------------------------------------------------------------------------------


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


async def index(request: Request) -> Response:
    return RedirectResponse("/streams", status_code=302)


async def streams_page(request: Request) -> Response:
    console = _console(request)
    streams = await console.sampler.sample()
    internal = request.query_params.get("internal") == "1"
    shown = [
        s
        for s in streams
        if (internal or not s.name.startswith("__"))
        and console.may_see(request, Kind.STREAM, s.name)
    ]
    details = await asyncio.gather(
        *(console.client.describe_stream(s.name) for s in shown), return_exceptions=True
    )
    rows = [
        {
            "info": info,
            "subject": info.subject if info.subject != info.name else "",
            "total": stream_total(info),
            "rates": console.sampler.rates(info.name),
            "paused": sum(p.paused for p in info.partitions),
            "readonly": sum(p.readonly for p in info.partitions),
            # None when the stream went between the two calls
            "details": None if isinstance(d, BaseException) else d,
        }
        for info, d in zip(shown, details, strict=True)
    ]
    for d in details:
        if isinstance(d, BaseException) and not isinstance(d, NotFound):
            raise d
    subjects = any(row["subject"] for row in rows)
    return page(request, "streams.html", {"rows": rows, "internal": internal, "subjects": subjects})


async def stream_page(request: Request) -> Response:
    console = _console(request)
    name = request.path_params["stream"]
    info = await console.client.stream_info(name)
    details = await console.client.describe_stream(name)
    streams = await console.sampler.sample()
    cursors = [
        r
        for r in console.sampler.cursor_rows(streams)
        if r.key.stream == name and console.may_see_cursor(request, r.key.cursor_id)
    ]
    rates = console.sampler.rates(name)
    series = console.sampler.totals.get(name)
    chart = {
        "t": [s.time_s for s in series.rates()] if series else [],
        "rate": rates,
    }
    return page(
        request,
        "stream.html",
        {
            "info": info,
            "details": details,
            "total": stream_total(info),
            "rates": rates,
            "chart": json.dumps(chart),
            "cursors": cursors,
            "clustered": await console.in_cluster(),
        },
    )


async def messages_page(request: Request) -> Response:
    console = _console(request)
    name = request.path_params["stream"]
    info = await console.client.stream_info(name)
    query = MessageQuery.parse(request.query_params)
    newer_than = parse_position(request.query_params.get("above", ""), "above")
    result = await _page_of(console, name, query, newer_than)
    live = query.newest_first and not (query.token or query.at or query.offset) and not newer_than
    searched = query.searched_before + result.scanned
    go_on = (  # never from a live page: a search leaving it would tear down its tail
        not live
        and result.budget_exhausted
        and result.older_token
        and not result.messages
        and searched < SEARCH_BOUND
        and query.steps_taken < SEARCH_STEPS
    )
    return page(
        request,
        "messages.html",
        {
            "info": info,
            "query": query,
            "page": result,
            "live": live,
            "above": format_position(newer_than) if newer_than else "",
            "searched": searched,
            "search_bound": SEARCH_BOUND,
            "search_steps": SEARCH_STEPS,
            "go_on": query.params(
                token=result.older_token,
                offset="",
                searched=str(searched),
                steps=str(query.steps_taken + 1),
            )
            if go_on
            else "",
            "top": format_position(position(result.messages[0])) if result.messages else "",
            "bottom": format_position(position(result.messages[-1])) if result.messages else "",
            "focus": format_position(result.focus) if result.focus else "",
        },
    )


async def _page_of(
    console: Console, name: str, query: MessageQuery, newer_than: Position | None
) -> Page:
    """The page of the messages page (and of its export): ``newer_than`` a row (the "Newer"
    page), or as ``query`` says."""
    if newer_than is None:
        return await read_page(console.client, name, query)
    newer = await read_newer(console.client, name, query, newer_than)
    return Page(newer, None, 0, False, None)


async def message_page(request: Request) -> Response:
    console = _console(request)
    name = request.path_params["stream"]
    partition = int(request.path_params["partition"])
    offset = int(request.path_params["offset"])
    m = await message_at(console.client, name, partition, offset)
    if m is None:
        raise NoSuchOffset(f"partition {partition} of {name!r} holds no message at offset {offset}")
    full = request.query_params.get("full") == "1"
    shown = m.value if full else m.value[: render.DETAIL_BYTES]
    whole = len(shown) == len(m.value)
    return page(
        request,
        "message.html",
        {
            "stream": name,
            "m": m,
            "full": full,
            "cut": len(m.value) - len(shown),
            "text": render.as_text(shown) if whole else None,
            "text_cut": shown.decode("utf-8", "replace"),
            "json": render.pretty_json(m.value) if whole else None,
            "hex": render.hex_dump(shown),
        },
    )


async def export(request: Request) -> Response:
    console = _console(request)
    name = request.path_params["stream"]
    kind = request.path_params["kind"]
    if kind not in ("jsonl", "csv"):
        raise HTTPException(404, f"no export as {kind!r}; use .jsonl or .csv")
    query = MessageQuery.parse(request.query_params)
    newer_than = parse_position(request.query_params.get("above", ""), "above")
    result = await _page_of(console, name, query, newer_than)
    if kind == "jsonl":
        body = render.export_jsonl(name, result.messages)
        media = "application/x-ndjson"
    else:
        body = render.export_csv(name, result.messages)
        media = "text/csv"
    filename = f"{name}-messages.{kind}"
    return PlainTextResponse(
        body,
        media_type=media,
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


async def tail_events(request: Request) -> Response:
    """Server-sent events: each event's data is the HTML rows of messages that arrived, its id
    the tail's cursor (the server's token), so a browser that reconnects (``Last-Event-ID``, or
    ``cursor`` in the URL when the page opens a new stream) goes on from the last rows it
    received, neither repeating nor skipping any. It starts just past the row ``after``, or at
    the live end without one. While the server cannot be reached, ``trouble`` events say so and
    the tail tries again. A tail that cannot go on (past ``until``) sends its last rows without
    an id, then an ``end`` event (the page closes its stream); asked again from a cursor that
    is already finished, it answers 204, on which a browser's EventSource stops reconnecting."""
    console = _console(request)
    name = request.path_params["stream"]
    query = MessageQuery.parse(request.query_params)
    await console.client.stream_info(name)  # an unknown stream fails here, before streaming
    given = request.headers.get("last-event-id", "") or request.query_params.get("cursor", "")
    if given.strip() and not CURSOR_SHAPE.fullmatch(given.strip()):
        # it is echoed as the stream's `id:` line: only what the server's tokens look like
        raise BadQuery("cursor: not a cursor this console handed out; reload the page")
    start: Position | str | None = (
        given.strip() or parse_position(request.query_params.get("after", ""), "after") or None
    )
    row = templates.get_template("_rows.html")
    steps = tail(console.client, name, query, start, console.config.tail_poll_s, console.closing)
    first: TailStep | ClientError | None
    try:
        first = await anext(steps)
    except StopAsyncIteration:  # the console is closing
        first = None
    except ClientError as error:
        first = error
    finished = isinstance(first, TailStep) and first.ended and not first.messages
    if first is None or (finished and isinstance(start, str)):  # a reconnect: nothing to say
        await steps.aclose()  # type: ignore[attr-defined]
        return Response(status_code=204)

    def event(step: TailStep) -> str:
        cursor = f"id: {step.cursor}\n" if step.cursor and not step.ended else ""
        if step.trouble is not None:
            return f"{cursor}event: trouble\ndata: {_one_line(step.trouble)}\n\n"
        if step.messages:
            html = row.render(stream=name, messages=step.messages, query=query, fresh=True)
            data = "".join(f"data: {line}\n" for line in html.splitlines() if line.strip())
            rows = f"{cursor}{data}\n"
        else:
            rows = "" if step.ended else f"{cursor}event: idle\ndata: \n\n"
        return rows + ("event: end\ndata: \n\n" if step.ended else "")

    async def events() -> AsyncIterator[str]:
        yield "retry: 2000\n\n"
        try:
            if isinstance(first, ClientError):
                raise first
            assert first is not None
            yield event(first)
            if first.ended:
                return
            async for step in steps:
                if await request.is_disconnected():
                    return
                yield event(step)
        except ClientError as error:
            yield f"event: failure\ndata: {_one_line(str(error))}\n\n"
        finally:
            await steps.aclose()  # type: ignore[attr-defined]

    return StreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


async def consumers_page(request: Request) -> Response:
    console = _console(request)
    streams = await console.sampler.sample()
    rows = [
        r
        for r in console.sampler.cursor_rows(streams)
        if console.may_see_cursor(request, r.key.cursor_id)
        and console.may_see(request, Kind.STREAM, r.key.stream)
    ]
    cursor_ids = sorted({r.key.cursor_id for r in rows})
    charts = {c: console.sampler.lag_chart(c) for c in cursor_ids}
    tidelog_groups = await console.client.list_groups()
    groups = [g for g in tidelog_groups if console.may_see(request, Kind.GROUP, g.group_id)]
    newest = newest_offsets(streams)

    def shown(stream: str) -> bool:  # as the cursor rows: only streams the visitor may see
        return console.may_see(request, Kind.STREAM, stream)

    lags = {g.group_id: group_lag(g, console.sampler.cursors, newest, shown) for g in groups}
    by_positions = [
        g
        for g in position_groups(
            console.sampler.cursors, newest, {g.group_id for g in tidelog_groups}, shown
        )
        if console.may_see(request, Kind.GROUP, g.group_id)
    ]
    named = {s for g in groups for m in g.members for s in m.streams}
    named |= {s for g in groups for a in g.assignments.values() for s in a}
    visible = {s for s in named if shown(s)}
    return page(
        request,
        "consumers.html",
        {
            "rows": rows,
            "groups": groups,
            "lags": lags,
            "position_groups": by_positions,
            "visible": visible,
            "cursor_ids": cursor_ids,
            "charts": json.dumps(charts),
            "stalled": ConsumerState.STALLED,
            "stall_after_s": console.config.stall_after_s,
            "error": console.sampler.last_error,
        },
    )


async def views_page(request: Request) -> Response:
    console = _console(request)
    streams = [
        s
        for s in await console.client.list_streams()
        if not s.name.startswith("__") and console.may_see(request, Kind.STREAM, s.name)
    ]
    views = []
    for info in streams:
        for status in await console.client.list_views(info.name):
            views.append((info.name, status))
    return page(request, "views.html", {"views": views})


async def view_page(request: Request) -> Response:
    console = _console(request)
    stream = request.path_params["stream"]
    name = request.path_params["view"]
    statuses = await console.client.list_views(stream)
    status = next((s for s in statuses if s.view.name == name), None)
    if status is None:
        raise NotFound(f"stream {stream!r} has no view {name!r}")
    params = request.query_params
    key_text = params.get("key", "").strip()
    entries: list[Any] = []
    asked = False
    if key_text:
        asked = True
        key = parse_bytes(key_text, "key")
        if status.view.kind == "table":
            entry = await console.client.view_get(stream, name, key)
            entries = [entry] if entry is not None else []
        else:
            count = int_field(params.get("count") or "10", "count", 1, VIEW_MAX_COUNT)
            since = parse_time(params["since"], "since") if params.get("since") else None
            until = parse_time(params["until"], "until") if params.get("until") else None
            entries = await console.client.last_values(stream, name, key, count, since, until)
    return page(
        request,
        "view.html",
        {
            "stream": stream,
            "status": status,
            "entries": entries,
            "asked": asked,
            "params": params,
        },
    )


async def replication_page(request: Request) -> Response:
    console = _console(request)
    try:
        sites = await console.client.site_status()
        enabled = True
    except ClientError as error:
        if isinstance(error, Unavailable):
            raise
        sites, enabled = [], False
    return page(request, "replication.html", {"sites": sites, "enabled": enabled})


async def cluster_page(request: Request) -> Response:
    """Brokers, the controller, and each partition's leader, replicas, ISR and followers' lag,
    as the broker the console talks to gathers them from each leader."""
    console = _console(request)
    try:
        status = await console.client.cluster_status()
    except FailedPrecondition:  # a single broker: not part of a cluster
        return page(request, "cluster.html", {"status": None})
    rows = [
        {
            "p": p,
            "committed": p.high_watermark if p.high_watermark >= 0 else None,
            "written": p.log_end - 1 if p.log_end >= 0 else None,
            "under": len(p.isr) < p.min_isr,
            "replicas": [
                {
                    "id": b,
                    "leader": b == p.leader,
                    "in_sync": b in p.isr,
                    "lag": p.lag(b),
                    "down": any(f.broker_id == b and f.down for f in p.followers),
                }
                for b in p.replicas
            ],
        }
        for p in sorted(status.partitions, key=lambda p: (p.stream, p.partition))
        if not p.stream.startswith("__") or request.query_params.get("internal")
    ]
    brokers = console.brokers.rows(status, time.time())
    return page(request, "cluster.html", {"status": status, "rows": rows, "brokers": brokers})


# -- admin actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    title: str
    describe: Callable[[dict[str, str]], str]
    run: Callable[[AsyncClient, dict[str, str]], Awaitable[None]]
    then: Callable[[dict[str, str]], str]


def _partitions(form: dict[str, str]) -> list[int] | None:
    text = form.get("partitions", "").strip()
    if not text:
        return None
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise BadQuery(f"partitions: {text!r} is not a comma-separated list of numbers") from None


def _which(form: dict[str, str]) -> str:
    parts = _partitions(form)
    return "every partition" if parts is None else "partitions " + ", ".join(map(str, parts))


async def _create(client: AsyncClient, form: dict[str, str]) -> None:
    try:
        partitions = int(form.get("partition_count") or 1)
    except ValueError:
        raise BadQuery("partitions: give a whole number of partitions") from None
    await client.create_stream(form["stream"], partitions=partitions)


async def _set_cursor(client: AsyncClient, form: dict[str, str]) -> None:
    try:
        partition, offset = int(form["partition"]), int(form["offset"])
    except (KeyError, ValueError):
        raise BadQuery("a cursor needs a partition and an offset, both whole numbers") from None
    await client.set_cursor(form["cursor"], form["stream"], partition, offset)


ACTIONS: dict[str, Action] = {
    "create": Action(
        "Create a stream",
        lambda f: (
            f"Create stream {f['stream']!r} with {f.get('partition_count') or 1} partition(s)."
        ),
        _create,
        lambda f: f"/streams/{f['stream']}",
    ),
    "pause": Action(
        "Pause",
        lambda f: (
            f"Pause {_which(f)} of {f['stream']!r}: their files are closed; a partition "
            f"resumes when a message is next published to it."
        ),
        lambda c, f: c.pause_stream(f["stream"], _partitions(f)),
        lambda f: f"/streams/{f['stream']}",
    ),
    "readonly": Action(
        "Make read-only",
        lambda f: f"Make {_which(f)} of {f['stream']!r} read-only: publishes are refused.",
        lambda c, f: c.set_stream_readonly(f["stream"], True, _partitions(f)),
        lambda f: f"/streams/{f['stream']}",
    ),
    "writable": Action(
        "Make writable",
        lambda f: f"Make {_which(f)} of {f['stream']!r} writable again.",
        lambda c, f: c.set_stream_readonly(f["stream"], False, _partitions(f)),
        lambda f: f"/streams/{f['stream']}",
    ),
    "delete": Action(
        "Delete a stream",
        lambda f: f"Delete stream {f['stream']!r} and every message in it. This cannot be undone.",
        lambda c, f: c.delete_stream(f["stream"]),
        lambda f: "/streams",
    ),
    "set-cursor": Action(
        "Set a cursor",
        lambda f: (
            f"Set cursor {f.get('cursor', '')!r} on {f['stream']!r} partition "
            f"{f.get('partition', '')} to offset {f.get('offset', '')}."
        ),
        _set_cursor,
        lambda f: "/consumers",
    ),
}


def same_origin(request: Request) -> bool:
    """A POST from a page of this console (or from a client that sends no Origin at all; the
    gate has checked the ``Host`` it is compared with)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


FORM_LIMIT = 65536
"""The most bytes of a posted form the console reads: its forms are a few fields. A larger
body is refused (413) without being read, since the login takes POSTs from anyone."""


async def bounded_body(request: Request, limit: int = FORM_LIMIT) -> bytes | None:
    """The request's body, or None when it is over ``limit`` bytes: refused at once by its
    ``Content-Length``, else (chunked) as soon as what arrived passes the limit — never held
    whole in memory."""
    declared = request.headers.get("content-length", "")
    if declared.strip().isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def posted_form(request: Request) -> dict[str, str] | Response:
    """The form of a POST from this console's own pages, its CSRF token checked and removed; a
    refusal page for any other (403), or for a body over :data:`FORM_LIMIT` (413)."""
    if not same_origin(request):
        return problem(request, 403, "Refused", "Actions are taken only from this console's pages.")
    body = await bounded_body(request)
    if body is None:
        return problem(
            request,
            413,
            "Too large",
            f"A form sent to the console has at most {FORM_LIMIT // 1024} KiB; this one has more.",
        )
    form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    if not csrf_matches(session_of(request), form.pop("csrf", None)):
        return problem(
            request,
            403,
            "Refused",
            "This form is not from this console's current page (its session ended, or another "
            "site sent it). Reload the page and try again.",
        )
    return form


async def action(request: Request) -> Response:
    name = request.path_params["action"]
    act = ACTIONS.get(name)
    if act is None:
        raise HTTPException(404, f"no action {name!r}")
    form = await posted_form(request)
    if isinstance(form, Response):
        return form
    if not form.get("stream", "").strip():
        raise BadQuery("name the stream")
    form["stream"] = form["stream"].strip()
    _console(request).guard.check(principal_of(request), ACTION_ACCESS[name](form))
    if form.pop("confirmed", "") != "yes":
        return page(
            request,
            "confirm.html",
            {"title": act.title, "what": act.describe(form), "action": name, "form": form},
        )
    await act.run(_console(request).client, form)
    LOG.info("console action %s: %s", name, urlencode(form))
    return RedirectResponse(act.then(form), status_code=303)


# -- the guard -----------------------------------------------------------------------------------

Op = Operation
PageRule = Callable[[dict[str, Any]], tuple[Access, ...]]


def _on_stream(op: Operation) -> PageRule:
    return lambda params: (on(op, Kind.STREAM, params["stream"]),)


PAGE_ACCESS: dict[str, PageRule] = {
    "/": lambda _: (),  # a redirect to /streams
    LOGIN_PATH: lambda _: (),  # shows nothing; the gate lets anyone reach it
    "/logout": lambda _: (),  # ends the visitor's own session
    "/streams": lambda _: (),  # a listing: shows only what the caller may see
    "/streams/{stream}": _on_stream(Op.DESCRIBE),
    "/streams/{stream}/messages": _on_stream(Op.SUBSCRIBE),
    "/streams/{stream}/messages/{partition:int}/{offset:int}": _on_stream(Op.SUBSCRIBE),
    "/streams/{stream}/export.{kind}": _on_stream(Op.SUBSCRIBE),
    "/streams/{stream}/tail": _on_stream(Op.SUBSCRIBE),
    "/consumers": lambda _: (on(Op.DESCRIBE, Kind.GROUP), on(Op.CURSOR, Kind.CURSOR)),
    "/views": lambda _: (),  # a listing
    "/views/{stream}/{view}": _on_stream(Op.SUBSCRIBE),
    "/replication": lambda _: (on(Op.SITE, Kind.SITE),),
    "/cluster": lambda _: (on(Op.ADMIN, Kind.CLUSTER),),
}
"""Each page's route -> what it shows, checked by the guard before the page is built (the
static assets under ``/static`` are the console's own files and need no access)."""

ACTION_ACCESS: dict[str, Callable[[dict[str, str]], tuple[Access, ...]]] = {
    "create": lambda f: (on(Op.CREATE, Kind.STREAM, f["stream"]),),
    "pause": lambda f: (on(Op.ALTER, Kind.STREAM, f["stream"]),),
    "readonly": lambda f: (on(Op.ALTER, Kind.STREAM, f["stream"]),),
    "writable": lambda f: (on(Op.ALTER, Kind.STREAM, f["stream"]),),
    "delete": lambda f: (on(Op.DELETE, Kind.STREAM, f["stream"]),),
    # the server's rule: a group's positions (`__group:<G>`) need `group` on G
    "set-cursor": lambda f: (
        cursor_access(f.get("cursor", "")),
        on(Op.DESCRIBE, Kind.STREAM, f["stream"]),
    ),
}
"""Each action -> what it changes, checked by the guard before it is confirmed or taken."""


def _guarded(path: str, endpoint: Callable[[Request], Awaitable[Response]]) -> Route:
    """``endpoint`` at ``path``, served only once the guard accepts what :data:`PAGE_ACCESS`
    says the page shows (a page missing from the table cannot be routed)."""
    rule = PAGE_ACCESS[path]

    async def page_behind_guard(request: Request) -> Response:
        _console(request).guard.check(principal_of(request), rule(dict(request.path_params)))
        return await endpoint(request)

    return Route(path, page_behind_guard)


async def on_denied(request: Request, error: Exception) -> Response:
    return problem(request, 403, "Refused", str(error))


# -- signing in ----------------------------------------------------------------------------------


def _next(target: str | None) -> str:
    """Where to go after signing in: a path of this console only (never another site)."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/streams"
    return target


async def login_page(request: Request) -> Response:
    return page(request, "login.html", {"next": _next(request.query_params.get("next"))})


async def login(request: Request) -> Response:
    """Sign in with a token: a new session (and cookie) for its principal."""
    form = await posted_form(request)
    if isinstance(form, Response):
        return form
    console = _console(request)
    target = _next(form.get("next"))
    token = form.get("token", "").strip()
    if not console.gate.accepts_tokens:
        return page(
            request,
            "login.html",
            {"next": target, "failure": "This server takes no tokens (it has no tokens_file)."},
            status_code=401,
        )
    session = console.keeper.sign_in(request, token) if token else None
    if session is None:
        LOG.warning("console: a sign-in with an unknown token was refused")
        return page(
            request,
            "login.html",
            {
                "next": target,
                "failure": "Unknown token (revoked, mistyped, or for another server).",
            },
            status_code=401,
        )
    LOG.info("console: %s signed in", session.principal)
    response = RedirectResponse(target, status_code=303)
    response.headers.append("set-cookie", console.keeper.cookie_for(session))
    return response


async def logout(request: Request) -> Response:
    form = await posted_form(request)
    if isinstance(form, Response):
        return form
    console = _console(request)
    console.keeper.sign_out(request)
    response = RedirectResponse(LOGIN_PATH, status_code=303)
    response.headers.append("set-cookie", console.keeper.cookie_for(None))
    return response


# -- the app -------------------------------------------------------------------------------------


class ServerSideGate(Gate, Protocol):
    """The gate ``tidelog serve`` hands its console (``tidelog.api.http.ServerGate``)."""

    def client_tls(self) -> Any:
        """The ``ClientTls`` the console's client calls the broker with."""
        ...


def for_server(address: str, gate: ServerSideGate) -> Starlette:
    """The console as ``tidelog serve`` serves it (``tidelog.api.http.ConsoleFactory``): for the
    gRPC port at ``address``, its client calling as the server itself (docs/security.md)."""
    client = dataclasses.replace(CONSOLE_CLIENT_SETTINGS, tls=gate.client_tls())
    return create_app(ConsoleConfig(address, client=client), gate)


def create_app(config: ConsoleConfig, gate: Gate | None = None) -> Starlette:
    """The console as an ASGI app for the server at ``config.server``, behind ``gate`` (the
    server's, from ``tidelog serve``; else open, served on the loopback names only)."""
    console = Console(config, gate or OpenGate())
    routes = [
        Route(LOGIN_PATH, login_page, methods=["GET"]),  # the gate lets anyone reach these
        Route(LOGIN_PATH, login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        _guarded("/", index),
        _guarded("/streams", streams_page),
        _guarded("/streams/{stream}", stream_page),
        _guarded("/streams/{stream}/messages", messages_page),
        _guarded("/streams/{stream}/messages/{partition:int}/{offset:int}", message_page),
        _guarded("/streams/{stream}/export.{kind}", export),
        _guarded("/streams/{stream}/tail", tail_events),
        _guarded("/consumers", consumers_page),
        _guarded("/views", views_page),
        _guarded("/views/{stream}/{view}", view_page),
        _guarded("/replication", replication_page),
        _guarded("/cluster", cluster_page),
        Route("/actions/{action}", action, methods=["POST"]),  # ACTION_ACCESS, in the action
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers: dict[Any, Any] = {
        PermissionDenied: on_denied,
        NotFound: on_not_found,
        NoSuchOffset: on_not_found,
        Unavailable: on_unavailable,
        BadQuery: on_bad_request,
        InvalidArgument: on_bad_request,
        AlreadyExists: on_client_error,
        ClientError: on_client_error,
        HTTPException: on_http,
        Exception: on_bug,
    }
    gate_middleware = Middleware(GateMiddleware, keeper=console.keeper, refuse=refuse)
    app = Starlette(
        routes=routes,
        exception_handlers=handlers,
        middleware=[gate_middleware],
        lifespan=console.lifespan,
    )
    app.state.console = console
    # Called by whoever serves the app (tidelog.api.http) before it stops the port.
    app.state.before_shutdown = console.request_close
    return app
