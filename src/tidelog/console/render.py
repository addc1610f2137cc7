"""How the console shows bytes, times and series: pure functions, no I/O.

A value is shown three ways: as UTF-8 text, as JSON pretty-printed (when it parses), and as a
hex dump. Lists show a short preview; anything longer than a page can hold is cut at a stated
number of bytes, with a link to see it all. Keys and header values are cut the same way in a
table (:data:`CELL_CHARS`), so one huge key cannot widen a page. Exports (JSON lines, CSV) carry
a value as text when it is valid UTF-8 and as base64 otherwise, never mangled; keys and header
values in the exports are in their filter form (:func:`filter_form`), so a text ``hex:00ff`` is
not taken for the bytes 00ff; a CSV cell that a spreadsheet would run as a formula gets a
leading ``'`` (:func:`csv_cell`).

Bytes that are not UTF-8 are written ``hex:…`` (:func:`printable`, :data:`HEX_PREFIX`), the
form the filters read back (``tidelog.console.query.parse_bytes``); :func:`filter_form` gives,
for any bytes, the text that filters on exactly them (``text:…`` for a text that would
otherwise read as hex).
"""

from __future__ import annotations

import base64
import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

PREVIEW_CHARS = 160
"""A list row shows at most this many characters of a value."""
DETAIL_BYTES = 64 * 1024
"""A message page shows at most this many bytes of a value unless asked for all of it."""
HEX_ROW = 16
CELL_CHARS = 80
"""A key or header value in a table shows at most this many characters (the message page shows
it whole, wrapped)."""
HEX_PREFIX = "hex:"
"""How bytes that are not UTF-8 are shown, and written in a filter."""
TEXT_PREFIX = "text:"
"""Written before a text filter that would otherwise read as hex (``text:0xbeef``)."""
LEGACY_HEX_PREFIX = "0x"
"""The older way to write hex in a filter, still read so that old links keep their meaning."""


class Shown(Protocol):
    """What the renderers read of a message (``tidelog.client.ReceivedMessage`` fits)."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes: ...
    @property
    def headers(self) -> Mapping[str, bytes]: ...
    @property
    def partition(self) -> int: ...


def as_text(data: bytes) -> str | None:
    """``data`` as UTF-8, or None when it is not valid UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def pretty_json(data: bytes) -> str | None:
    """``data`` parsed as JSON and indented, or None when it is not JSON (a bare number or string
    counts as JSON but is not worth a second view: None too)."""
    text = as_text(data)
    if text is None or not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False, sort_keys=False)
    except ValueError:
        return None


def hex_dump(data: bytes) -> str:
    """Rows of 16 bytes: position, hex, and the printable ASCII characters."""
    rows = []
    for position in range(0, len(data), HEX_ROW):
        chunk = data[position : position + HEX_ROW]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        rows.append(f"{position:08x}  {hexes:<{HEX_ROW * 3 - 1}}  {ascii_}")
    return "\n".join(rows)


def preview(data: bytes | None, limit: int = PREVIEW_CHARS) -> tuple[str, bool]:
    """A one-line preview and whether it was cut: text when ``data`` is UTF-8 (newlines shown as
    spaces), else its first bytes in hex."""
    if data is None:
        return "", False
    text = as_text(data)
    if text is None:
        shown = data[: limit // 3].hex(" ")
        return shown, len(data) > limit // 3
    flat = " ".join(text.split())
    return flat[:limit], len(flat) > limit


def printable(data: bytes | None) -> str:
    """A key or header value for a page: text, or ``hex:…`` when not UTF-8 (pages mark the hex
    form apart, :func:`is_binary`, so a text key that happens to read ``hex:…`` is not taken
    for it)."""
    if data is None:
        return ""
    text = as_text(data)
    return text if text is not None else HEX_PREFIX + data.hex()


def is_binary(data: bytes | None) -> bool:
    """Whether ``data`` is shown in hex (it is not UTF-8)."""
    return data is not None and as_text(data) is None


def filter_form(data: bytes) -> str:
    """What to write in a key (or prefix, contains) filter to match exactly ``data``: ``hex:…``
    for bytes that are not UTF-8, ``text:…`` for a text that starts like a hex or text form,
    the text itself otherwise."""
    text = as_text(data)
    if text is None:
        return HEX_PREFIX + data.hex()
    if text.startswith((HEX_PREFIX, TEXT_PREFIX, LEGACY_HEX_PREFIX)):
        return TEXT_PREFIX + text
    return text


def cell(data: bytes | None, limit: int = CELL_CHARS) -> tuple[str, bool]:
    """A key or header value for a table cell: :func:`printable`, cut to ``limit`` characters,
    and whether it was cut."""
    shown = printable(data)
    return shown[:limit], len(shown) > limit


def format_ns(timestamp_ns: int) -> str:
    """UTC, to the millisecond: ``2026-11-25 11:42:07.123``."""
    moment = datetime.fromtimestamp(timestamp_ns / 1e9, tz=UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def format_bytes(count: int) -> str:
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """The largest whole unit that fits: ``7 d``, ``36 h``, ``90 min``, ``45 s``, ``0.5 s``."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"


# -- exports -------------------------------------------------------------------------------------


def _bytes_fields(name: str, data: bytes | None) -> dict[str, Any]:
    """``{name: text}`` for UTF-8 (or None), else ``{name + "_base64": ...}``."""
    if data is None:
        return {name: None}
    text = as_text(data)
    if text is not None:
        return {name: text}
    return {f"{name}_base64": base64.b64encode(data).decode()}


def export_record(stream: str, m: Shown) -> dict[str, Any]:
    record: dict[str, Any] = {
        "stream": stream,
        "partition": m.partition,
        "offset": m.offset,
        "timestamp_ns": m.timestamp,
        "time": format_ns(m.timestamp),
    }
    record.update(_bytes_fields("key", m.key))
    record["headers"] = {k: filter_form(v) for k, v in m.headers.items()}
    record.update(_bytes_fields("value", m.value))
    return record


def export_jsonl(stream: str, messages: Iterable[Shown]) -> str:
    """One JSON object per message and line, in the order given."""
    return "".join(
        json.dumps(export_record(stream, m), ensure_ascii=False) + "\n" for m in messages
    )


CSV_COLUMNS: Sequence[str] = (
    "stream",
    "partition",
    "offset",
    "timestamp_ns",
    "time",
    "key",
    "headers",
    "value",
    "value_base64",
)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet may run as a formula at the start of a cell (OWASP, "CSV Injection")."""


def csv_cell(text: str) -> str:
    """``text`` for a CSV cell: with a leading ``'`` when it starts like a formula, so a
    spreadsheet shows it as text instead of running it (the JSON lines export keeps it as is)."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def export_csv(stream: str, messages: Iterable[Shown]) -> str:
    """A header row, then one row per message; ``value`` holds UTF-8 text, ``value_base64`` the
    value when it is not UTF-8; ``headers`` is a JSON object; the key and the header values are
    written in their :func:`filter_form` (``hex:…`` bytes apart from a text that reads
    ``text:hex:…``). Every text cell passes :func:`csv_cell` (base64 may start with ``+``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180: a \r in a cell is quoted too
    writer.writerow(CSV_COLUMNS)
    for m in messages:
        text = as_text(m.value)
        writer.writerow(
            (
                csv_cell(stream),
                m.partition,
                m.offset,
                m.timestamp,
                format_ns(m.timestamp),
                csv_cell(filter_form(m.key)) if m.key is not None else "",
                json.dumps({k: filter_form(v) for k, v in m.headers.items()}, ensure_ascii=False),
                csv_cell(text) if text is not None else "",
                "" if text is not None else csv_cell(base64.b64encode(m.value).decode()),
            )
        )
    return out.getvalue()


# -- charts --------------------------------------------------------------------------------------


def sparkline_points(values: Sequence[float], width: int = 120, height: int = 24) -> str:
    """The ``points`` of an SVG polyline drawing ``values`` left to right, scaled to fit; empty
    for fewer than two values. The lowest drawn line is zero (rates never go negative)."""
    if len(values) < 2:
        return ""
    top = max(max(values), 1e-9)
    step = width / (len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{height - (max(v, 0.0) / top) * (height - 2) - 1:.1f}"
        for i, v in enumerate(values)
    )


# -- remote sites --------------------------------------------------------------------------------

SITE_ADVICE: Mapping[str, str] = {
    "unreachable": "No site answered at {address}. Check that its server runs with --site-id "
    "and that this address and port reach it from here (firewall, DNS).",
    "UNAVAILABLE": "The site at {address} stopped answering. It may be restarting or cut off; "
    "this server reconnects by itself.",
    "DEADLINE_EXCEEDED": "The site at {address} answered too slowly. Check its load and the "
    "network between the sites; this server retries by itself.",
    "UNAUTHENTICATED": "The site at {address} did not accept this server's credentials. Check the "
    "site's tls_client_ca and this server's certificate (docs/replication.md).",
    "PERMISSION_DENIED": "The site at {address} refused this server. Its ACL must grant this "
    "server's principal the site permission (docs/replication.md).",
    "UNIMPLEMENTED": "The server at {address} is not a tidelog site (or is too old). Check the "
    "address, and start that server with --site-id.",
}
"""The failures a sender reports (``tidelog.sites.sender_link.describe`` writes ``CODE:
details``; ``unreachable: …`` before the site answered), as what a person can do about them."""


def site_advice(reason: str, address: str) -> str | None:
    """A sentence a person can act on for a site's ``reason``, or None when the reason is not a
    failure (a negotiation's reason, already plain words)."""
    code = reason.partition(":")[0].strip()
    advice = SITE_ADVICE.get(code)
    return advice.format(address=address) if advice is not None else None
