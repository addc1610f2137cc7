"""Stream lifecycle over ``proto.API`` against a real server: DeleteStream racing CreateStream of
the same name on another connection keeps the new stream (and its acked messages) across a
restart, and clients may not write, pause or freeze ``__cursors``."""

from __future__ import annotations

import threading
from pathlib import Path

import grpc
import pytest
from tests.support.server import ServerProcess

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc


def _count(api: pb_grpc.APIStub, stream: str, partition: int) -> list[bytes]:
    calls = api.Subscribe(
        pb.SubscribeRequest(
            stream=stream,
            partition=partition,
            startPosition=pb.EARLIEST,
            stopPosition=pb.STOP_LATEST,
        ),
        timeout=20,
    )
    values: list[bytes] = []
    try:
        for message in calls:
            values.append(message.value)
    except grpc.RpcError as error:
        # Liftbridge ends a STOP_LATEST subscription with RESOURCE_EXHAUSTED "stop offset".
        assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED, error
    return values[1:]  # the first message is the handshake


@pytest.mark.parametrize("round_", range(3))
def test_delete_racing_create_keeps_the_new_streams_acked_messages(
    tmp_path: Path, round_: int
) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with (
            grpc.insecure_channel(server.address) as deleting,
            grpc.insecure_channel(server.address) as creating,
        ):
            api_d, api_c = pb_grpc.APIStub(deleting), pb_grpc.APIStub(creating)
            api_c.CreateStream(pb.CreateStreamRequest(name="s", partitions=32), timeout=20)
            for number in range(32):
                api_c.Publish(pb.PublishRequest(stream="s", partition=number, value=b"old"))
            errors: list[grpc.RpcError] = []

            def delete() -> None:
                try:
                    api_d.DeleteStream(pb.DeleteStreamRequest(name="s"), timeout=20)
                except grpc.RpcError as error:
                    errors.append(error)

            thread = threading.Thread(target=delete)
            thread.start()
            codes = []
            for _ in range(2_000):
                try:
                    api_c.CreateStream(pb.CreateStreamRequest(name="s", partitions=32), timeout=20)
                    break
                except grpc.RpcError as error:
                    codes.append(error.code())
            thread.join(20)
            assert not errors
            # Refusals while the old stream existed are ALREADY_EXISTS; never INTERNAL.
            assert set(codes) <= {grpc.StatusCode.ALREADY_EXISTS}, codes
            for i in range(200):
                ack = api_c.Publish(
                    pb.PublishRequest(stream="s", partition=3, value=b"new-%d" % i), timeout=20
                ).ack
                assert ack.offset == i
        assert server.stop() == 0, "".join(server.stderr_lines[-20:])
        server.start()
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            assert _count(api, "s", 3) == [b"new-%d" % i for i in range(200)]
    finally:
        server.kill()


def test_clients_may_not_write_pause_freeze_or_delete_cursors(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data").start()
    try:
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            denied = grpc.StatusCode.PERMISSION_DENIED
            calls = [
                (api.Publish, pb.PublishRequest(stream="__cursors", value=b"forged")),
                (api.PauseStream, pb.PauseStreamRequest(name="__cursors")),
                (
                    api.SetStreamReadonly,
                    pb.SetStreamReadonlyRequest(name="__cursors", readonly=True),
                ),
                (api.DeleteStream, pb.DeleteStreamRequest(name="__cursors")),
            ]
            for call, request in calls:
                with pytest.raises(grpc.RpcError) as raised:
                    call(request, timeout=20)
                assert raised.value.code() is denied, (call, raised.value)
                assert "internal" in (raised.value.details() or "")
            responses = list(
                api.PublishAsync(
                    iter([pb.PublishRequest(stream="__cursors", value=b"x", correlationId="c")]),
                    timeout=20,
                )
            )
            assert [r.asyncError.code for r in responses] == [
                pb.PublishAsyncError.PERMISSION_DENIED
            ]
            assert "internal" in responses[0].asyncError.message
            # SetCursor (the broker writes __cursors) works, also after a restart.
            api.CreateStream(pb.CreateStreamRequest(subject="orders", name="orders"), timeout=20)
            cursor = pb.SetCursorRequest(stream="orders", partition=0, cursorId="c", offset=9)
            api.SetCursor(cursor, timeout=20)
        server.restart()
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            fetch = pb.FetchCursorRequest(stream="orders", partition=0, cursorId="c")
            assert api.FetchCursor(fetch, timeout=20).offset == 9
            api.SetCursor(
                pb.SetCursorRequest(stream="orders", partition=0, cursorId="c", offset=10),
                timeout=20,
            )
            assert api.FetchCursor(fetch, timeout=20).offset == 10
    finally:
        server.kill()
