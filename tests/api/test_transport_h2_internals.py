"""The h2 internals the native transport relies on are still there and behave as it expects.

The transport writes DATA frames itself (``outbox.claim_data``: h2's ``streams``, its
connection and stream state machines, both outbound windows), replaces h2's HPACK decoder
(``h2setup._Decoder`` via the ``decoder`` attribute h2 lowers on a SETTINGS ACK) and sets
``max_inbound_frame_size``. None of that is h2's public API, so ``pyproject.toml`` pins h2 to
the tested minor; these tests fail loudly on an h2 that changed them.
"""

from __future__ import annotations

from h2.config import H2Configuration
from h2.connection import ConnectionInputs, H2Connection
from h2.events import DataReceived
from h2.stream import StreamInputs

from tidelog.api.transport.h2setup import (
    HEADER_DECODE_LIMIT,
    MAX_FRAME_SIZE,
    _Decoder,
    h2_connection,
)
from tidelog.api.transport.outbox import claim_data, frames


def test_the_attributes_the_transport_sets_and_reads_are_h2s_own() -> None:
    plain = vars(H2Connection(H2Configuration(client_side=False)))
    for name in ("decoder", "streams", "state_machine", "outbound_flow_control_window"):
        assert name in plain, f"h2.H2Connection has no attribute {name!r} any more"
    assert "max_inbound_frame_size" in plain or hasattr(H2Connection, "max_inbound_frame_size")
    assert ConnectionInputs.SEND_DATA and StreamInputs.SEND_DATA


def _connected() -> tuple[H2Connection, H2Connection]:
    server = h2_connection()
    client = H2Connection(H2Configuration(client_side=True, header_encoding=None))
    client.initiate_connection()
    server.receive_data(client.data_to_send())
    client.receive_data(server.data_to_send())
    server.receive_data(client.data_to_send())  # the client's SETTINGS ACK
    return server, client


def test_the_decoder_and_frame_size_survive_the_settings_acknowledgement() -> None:
    server, _ = _connected()
    assert isinstance(server.decoder, _Decoder)
    assert server.decoder.max_header_list_size == HEADER_DECODE_LIMIT
    assert server.max_inbound_frame_size == MAX_FRAME_SIZE


def test_data_claimed_outside_h2_moves_its_windows_and_reaches_the_peer() -> None:
    server, client = _connected()
    request = [(b":method", b"POST"), (b":path", b"/t.T/M"), (b":scheme", b"http")]
    client.send_headers(1, [*request, (b":authority", b"x")])
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(b":status", b"200")])
    stream_window = server.local_flow_control_window(1)
    connection_window = server.outbound_flow_control_window
    claim_data(server, 1, 100)
    assert server.local_flow_control_window(1) == stream_window - 100
    assert server.outbound_flow_control_window == connection_window - 100
    wire = server.data_to_send() + b"".join(frames(1, [bytes(100)], 16384))
    events = client.receive_data(wire)
    received = [e for e in events if isinstance(e, DataReceived)]
    assert [(e.stream_id, len(e.data or b"")) for e in received] == [(1, 100)]
