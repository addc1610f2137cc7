"""The client's transmit: one message per entry until the server says it reads packed calls
(``packed_transmit``), packed from then on (``tidelog/client/site_calls.py``)."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog.client.site_calls import SiteCalls


class FakeStub:
    """Records each TransmitRequest; answers with ``packed`` as the server's word."""

    def __init__(self, packed: bool) -> None:
        self.packed = packed
        self.requests: list[v1.TransmitRequest] = []

    async def Transmit(self, request: v1.TransmitRequest, **_: Any) -> v1.TransmitResponse:
        self.requests.append(request)
        count = len(request.entries) or len(request.payload_sizes) // 4
        return v1.TransmitResponse(positions=range(count), packed_transmit=self.packed)


class Calls(SiteCalls):
    def __init__(self, stub: FakeStub) -> None:
        self._v1 = stub  # type: ignore[assignment]


ITEMS = [(b"a", ["b"]), (b"cd", ["b", "c"]), (b"", ["b"])]


def test_a_server_from_before_the_packed_fields_keeps_getting_entries() -> None:
    stub = FakeStub(packed=False)
    calls = Calls(stub)
    for _ in range(3):
        assert asyncio.run(calls.transmit_many("app", ITEMS)) == [0, 1, 2]
    assert all(len(r.entries) == 3 and not r.payloads for r in stub.requests)


def test_once_the_server_says_packed_the_calls_go_packed() -> None:
    stub = FakeStub(packed=True)
    calls = Calls(stub)
    asyncio.run(calls.transmit_many("app", ITEMS))
    asyncio.run(calls.transmit_many("app", ITEMS))
    first, second = stub.requests
    assert [(e.payload, list(e.destinations)) for e in first.entries] == ITEMS
    assert not second.entries and second.client_name == "app"
    assert second.payloads == b"acd"
    assert struct.unpack("<3I", second.payload_sizes) == (1, 2, 0)
    assert [list(d.sites) for d in second.destination_lists] == [["b"], ["b", "c"]]
    assert struct.unpack("<3I", second.destination_indexes) == (0, 1, 0)
