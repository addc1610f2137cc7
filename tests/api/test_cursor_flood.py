"""A flood of SetCursor calls with 250 KiB ids on streams that do not exist stores nothing:
every call is refused before anything is appended or indexed, so the server's memory stays
flat and ``__cursors`` stays empty, also after a restart (``broker/cursors.py``, "Bounds").

Measured on the commit before the bounds: 1,500 such calls grew the server from 100 to 477 MB,
and about 960 MB after a restart, kept for good."""

from __future__ import annotations

from pathlib import Path

import grpc
from tests.support.server import served

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
from tidelog.wire import CURSORS_STREAM

CALLS = 1_500
ID_BYTES = 250 << 10
GROWTH_ALLOWED = 64 << 20
"""A margin for the allocator and gRPC's buffers; the flood itself is 375 MB of ids."""


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError("no VmRSS")


def stored_bytes(data: Path) -> int:
    return sum(
        p.stat().st_size for p in (data / "streams" / CURSORS_STREAM).rglob("*.log") if p.is_file()
    )


def test_a_flood_of_long_ids_on_missing_streams_leaves_memory_flat_and_nothing_on_disk(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    with served(data) as server:
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            api.CreateStream(pb.CreateStreamRequest(subject="real", name="real"))
            api.SetCursor(pb.SetCursorRequest(cursorId="warm", stream="real", offset=1))
            before = rss(server.pid)
            codes: dict[grpc.StatusCode, int] = {}
            for i in range(CALLS):
                long_id = f"{i:06d}".ljust(ID_BYTES, "x")
                stream = f"missing-{i}"
                request = pb.SetCursorRequest(cursorId=long_id, stream=stream, offset=i)
                if i % 2:  # half with an id of a normal length: refused for the stream alone
                    request.cursorId = f"c{i}"
                try:
                    api.SetCursor(request)
                except grpc.RpcError as error:
                    codes[error.code()] = codes.get(error.code(), 0) + 1
            grown = rss(server.pid) - before
            assert codes == {
                grpc.StatusCode.INVALID_ARGUMENT: CALLS // 2,
                grpc.StatusCode.NOT_FOUND: CALLS // 2,
            }
            assert grown < GROWTH_ALLOWED, f"the server grew by {grown >> 20} MiB"
        written = stored_bytes(data)
        server.restart()
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            fetched = api.FetchCursor(pb.FetchCursorRequest(cursorId="warm", stream="real"))
            assert fetched.offset == 1
        assert stored_bytes(data) == written, "nothing of the flood was stored"
        assert rss(server.pid) < before + GROWTH_ALLOWED
