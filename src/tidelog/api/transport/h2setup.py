"""The h2 state machine of one server connection, set up with tidelog's HTTP/2 settings.

What the server announces (:data:`MAX_CONCURRENT_STREAMS`, :data:`STREAM_WINDOW`,
:data:`MAX_HEADER_LIST`, :data:`MAX_FRAME_SIZE`) and opens (:data:`CONNECTION_WINDOW`), and
the two places it reaches past h2's public API (pinned in ``pyproject.toml``, checked by
``tests/api/test_transport_h2_internals.py``): the HPACK decoder is replaced by one whose limit
stays at :data:`HEADER_DECODE_LIMIT` (a call over :data:`MAX_HEADER_LIST` then fails alone,
``connection.py``), and frames up to :data:`MAX_FRAME_SIZE` are accepted from the start.

Invariant: :func:`h2_connection` returns a server-side machine whose preface (SETTINGS and
the connection window's increase) is ready in ``data_to_send``.
"""

from __future__ import annotations

from typing import Final

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.settings import SettingCodes
from hpack import Decoder

MAX_CONCURRENT_STREAMS: Final = 256
"""Calls open at once on one connection (grpc clients queue more until one ends). Each open
``Subscribe`` holds about one batch in its handler however little the client reads, so this
times the subscription's byte budget is what one connection may pin beyond
``limits.CONNECTION_PENDING``; Go's net/http allows 250, grpc-core no limit."""
STREAM_WINDOW: Final = 1 << 20
CONNECTION_WINDOW: Final = 16 << 20
MAX_HEADER_LIST: Final = 16 << 10
"""The header list a call may have (grpc's hard limit): announced in SETTINGS, and a call over
it alone is answered RESOURCE_EXHAUSTED, as grpcio does."""
HEADER_DECODE_LIMIT: Final = 256 << 10
"""The decoded header list beyond which HPACK decoding stops and the connection ends (a
COMPRESSION_ERROR); between :data:`MAX_HEADER_LIST` and this only the call fails."""
MAX_FRAME_SIZE: Final = 1 << 20
_DEFAULT_WINDOW: Final = 65535


def h2_connection() -> H2Connection:
    """A server side h2 state machine with tidelog's settings, its preface ready to send."""
    h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
    h2.decoder = _Decoder()
    h2.initiate_connection()
    h2.update_settings(
        {
            SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
            SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
        }
    )
    # Accept frames up to our maximum from the start: h2 sizes its frame parser once per read,
    # so a peer's SETTINGS ACK and its first large DATA frame arriving in one read were refused
    # (FRAME_SIZE_ERROR for the whole connection) though the peer was right.
    h2.max_inbound_frame_size = MAX_FRAME_SIZE
    h2.increment_flow_control_window(CONNECTION_WINDOW - _DEFAULT_WINDOW)
    return h2


class _Decoder(Decoder):
    """HPACK's decoder, whose limit h2 lowers to the announced MAX_HEADER_LIST_SIZE once the
    client acknowledges it: kept at :data:`HEADER_DECODE_LIMIT`, so that a call a little
    over is refused alone (``_on_request``) rather than the whole connection."""

    def __init__(self) -> None:
        super().__init__(HEADER_DECODE_LIMIT)

    @property
    def max_header_list_size(self) -> int:
        return HEADER_DECODE_LIMIT

    @max_header_list_size.setter
    def max_header_list_size(self, value: int) -> None:
        pass
