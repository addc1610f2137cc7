"""Conformance with a real Liftbridge client library: gufo-liftbridge (asyncio), unmodified.

gufo talks to ``proto.API`` exactly as it talks to a Go Liftbridge server (see
``shared/research/liftbridge.md``, "What the clients actually call"): it resolves broker hosts to
IPv4, needs ``__cursors`` partition 0 in the metadata, publishes unary without a deadline,
publishes in bulk over ``PublishAsync``, stores cursor offset+1 and never ends a subscription by
itself (it resubscribes forever). So every read below is bounded by a message count and an
asyncio timeout, and the subscription generator is closed explicitly.

gufo's generated ``api_pb2`` registers the ``proto`` package in protobuf's global descriptor pool,
and so does ``tidelog._proto.liftbridge``: the two cannot be imported into one process
(``test_gufo_and_tidelog_import_into_one_process`` below). So each scenario runs in a child
interpreter -- this very file run as a script, ``python test_liftbridge_client.py SCENARIO
ADDRESS`` -- which drives gufo and prints what it observed as one JSON object; the tests assert
on that. Where gufo hides a status code, the test checks it with tidelog's own ``proto.API`` stub
(this process never imports gufo).

gufo has no TLS option (its channel is ``grpc.aio.insecure_channel``); the mutual-TLS scenario
replaces that one name in the child (``_gufo_over_tls``) and leaves the rest of gufo as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import Any

CHILD_TIMEOUT = 90.0
"""Upper bound for one scenario's child process (it is killed by PID after that)."""
READ_TIMEOUT = 10.0
"""Upper bound for one bounded read of a gufo subscription."""

Observed = dict[str, Any]


# ==================================================================================================
# The child side: gufo scenarios. Only this half imports gufo; it never imports tidelog's protos.
# ==================================================================================================


def _message(m: Any) -> Observed:
    return {
        "offset": m.offset,
        "value": m.value.decode("latin-1"),
        "key": m.key.decode("latin-1"),
        "headers": {k: v.decode("latin-1") for k, v in dict(m.headers).items()},
        "subject": m.subject,
        "partition": m.partition,
        "timestamp": m.timestamp,
    }


async def _take(messages: AsyncIterable[Any], count: int) -> list[Observed]:
    """The first ``count`` messages of a (never ending) gufo subscription, then close it."""
    got: list[Observed] = []
    async with contextlib.aclosing(messages) as subscription:  # type: ignore[type-var]
        async with asyncio.timeout(READ_TIMEOUT):
            async for message in subscription:
                got.append(_message(message))
                if len(got) == count:
                    break
    return got


async def _error(call: Awaitable[Any]) -> Observed | None:
    """The gufo exception ``call`` raised (class name and text), or None."""
    try:
        await call
    except Exception as error:
        return {"type": type(error).__name__, "message": str(error)}
    return None


def _partitions(stream: Any) -> Observed:
    return {
        str(n): {
            "id": p.id,
            "leader": p.leader,
            "replicas": p.replicas,
            "isr": p.isr,
            "high_watermark": p.high_watermark,
            "newest_offset": p.newest_offset,
            "paused": p.paused,
        }
        for n, p in stream.partitions.items()
    }


async def scenario_metadata(lb: Any, address: str) -> Observed:
    metadata = await lb.get_metadata()
    return {
        "brokers": [[b.id, b.host, b.port] for b in metadata.brokers],
        "streams": {s.name: _partitions(s) for s in metadata.metadata},
        "cursors_leader_address": lb.leaders.get(("__cursors", 0)),
    }


async def scenario_create(lb: Any, address: str) -> Observed:
    await lb.create_stream("orders", partitions=3, wait_for_stream=True)
    metadata = await lb.get_metadata("orders")
    (stream,) = metadata.metadata
    duplicate = await _error(lb.create_stream("orders"))
    compacted = await _error(lb.create_stream("compacted", enable_compact=True))
    after = await lb.get_metadata()
    return {
        "broker_id": metadata.brokers[0].id,
        "name": stream.name,
        "subject": stream.subject,
        "partitions": _partitions(stream),
        "duplicate": duplicate,
        "compacted": compacted,
        "streams_after": sorted(s.name for s in after.metadata),
        "partitions_after": sorted(
            next(s for s in after.metadata if s.name == "orders").partitions
        ),
    }


async def scenario_delete(lb: Any, address: str) -> Observed:
    await lb.create_stream("doomed", wait_for_stream=True)
    await lb.publish(b"x", stream="doomed")
    await lb.delete_stream("doomed")
    names = sorted(s.name for s in (await lb.get_metadata()).metadata)
    again = await _error(lb.delete_stream("doomed"))
    await lb.create_stream("doomed", wait_for_stream=True)
    fresh = await lb.get_partition_metadata("doomed", 0)
    return {
        "names_after_delete": names,
        "second_delete": again,
        "recreated": [fresh.high_watermark, fresh.newest_offset],
    }


async def scenario_publish_subscribe(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("events", wait_for_stream=True)
    empty = await lb.get_partition_metadata("events", 0)
    for i in range(10):
        await lb.publish(f"value-{i}".encode(), stream="events", headers={"test": str(i).encode()})
    got = await _take(lb.subscribe("events", start_position=StartPosition.EARLIEST), 10)
    full = await lb.get_partition_metadata("events", 0)
    return {
        "empty": [empty.high_watermark, empty.newest_offset],
        "messages": got,
        "full": [full.high_watermark, full.newest_offset],
        "now": time.time_ns(),
    }


async def scenario_positions(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    # Every check that waits for a message uses a stream no subscription has touched before (see
    # scenario_resubscribe for what goes wrong otherwise).
    await lb.create_stream("offsets", wait_for_stream=True)
    for i in range(10):
        await lb.publish(f"m{i}".encode(), stream="offsets")
    # OFFSET 5: the first five are 5..9; then publish one more and read one more: if the
    # subscription had anything else to deliver it would show up before offset 10.
    from_five = []
    async with contextlib.aclosing(lb.subscribe("offsets", start_offset=5)) as subscription:
        async with asyncio.timeout(READ_TIMEOUT):
            async for m in subscription:
                from_five.append(m.offset)
                if len(from_five) == 5:
                    await lb.publish(b"m10", stream="offsets")
                if len(from_five) == 6:
                    break
    latest = await _take(lb.subscribe("offsets", start_position=StartPosition.LATEST), 1)

    await lb.create_stream("times", wait_for_stream=True)
    for i in range(10):
        await lb.publish(f"t{i}".encode(), stream="times")
        if i == 3:
            # Keep ts(3) and ts(4) far apart compared with the float rounding gufo applies to
            # start timestamps (seconds as a float: about 0.25 us at today's epoch).
            await asyncio.sleep(0.05)
    every = await _take(lb.subscribe("times", start_position=StartPosition.EARLIEST), 10)
    ts = [m["timestamp"] for m in every]
    middle = (ts[3] + ts[4]) / 2 / 1e9
    by_time = await _take(lb.subscribe("times", start_timestamp=middle), 2)
    early = (ts[0] - 10**9) / 1e9
    before_all = await _take(lb.subscribe("times", start_timestamp=early), 1)

    await lb.create_stream("fresh", wait_for_stream=True)
    for i in range(10):
        await lb.publish(f"old-{i}".encode(), stream="fresh")
    new_only = await _first_while_publishing(
        lb, lb.subscribe("fresh", start_position=StartPosition.NEW_ONLY), "fresh", "new"
    )
    return {
        "earliest": [m["offset"] for m in every],
        "from_five": from_five,
        "latest": latest,
        "by_time": [m["offset"] for m in by_time],
        "before_all": [m["offset"] for m in before_all],
        "new_only": new_only,
    }


async def _first_while_publishing(
    lb: Any, messages: AsyncIterable[Any], stream: str, prefix: str, settle: float = 0.0
) -> Observed | None:
    """The first message a subscription delivers while ``<prefix>-<n>`` messages are published
    to ``stream`` every 50 ms (at most 100), starting ``settle`` seconds after it was opened.
    gufo gives no signal that a subscription exists, so this is how a test can know the
    subscriber waits before it publishes."""
    async with contextlib.aclosing(messages) as subscription:  # type: ignore[type-var]
        pending = asyncio.ensure_future(anext(aiter(subscription)))
        await asyncio.sleep(settle)
        for attempt in range(100):
            await lb.publish(f"{prefix}-{attempt}".encode(), stream=stream)
            done, _ = await asyncio.wait({pending}, timeout=0.05)
            if done:
                return _message(pending.result())
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
    return None


async def scenario_resubscribe(lb: Any, address: str) -> Observed:
    """gufo opens a new subscription for every read and closes it when done; a subscriber that
    waits for new messages must not be disturbed by an earlier one that went away."""
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("again", wait_for_stream=True)
    for i in range(3):
        await lb.publish(f"a{i}".encode(), stream="again")
    first = lb.subscribe("again", start_position=StartPosition.EARLIEST)
    async with contextlib.aclosing(first) as subscription:
        async with asyncio.timeout(READ_TIMEOUT):
            caught_up = [m.offset async for m in _prefix(subscription, 3)]
        await asyncio.sleep(0.2)  # the server side now waits for offset 3
    # Closed. The next subscriber waits for offset 3 too (it subscribes before anything is
    # published: a publish would replace what the earlier one broke), and must get it.
    waiting = await _first_while_publishing(
        lb, lb.subscribe("again", start_offset=3), "again", "b", settle=0.5
    )
    return {"caught_up": caught_up, "waiting": waiting}


async def _prefix(messages: AsyncIterable[Any], count: int) -> AsyncIterable[Any]:
    seen = 0
    async for m in messages:
        yield m
        seen += 1
        if seen == count:
            return


async def scenario_partition(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("parts", partitions=3, wait_for_stream=True)
    await lb.publish(b"two", stream="parts", partition=2, key=b"k")
    await lb.publish(b"zero", stream="parts", partition=0)
    got = await _take(lb.subscribe("parts", partition=2, start_position=StartPosition.EARLIEST), 1)
    (stream,) = (await lb.get_metadata("parts")).metadata
    return {
        "messages": got,
        "newest": {str(n): p.newest_offset for n, p in stream.partitions.items()},
    }


async def scenario_bulk(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("bulk", partitions=2, wait_for_stream=True)
    values = [f"payload {i} ".encode() * 40 for i in range(10)]
    requests = [
        lb.get_publish_request(
            values[i],
            stream="bulk",
            partition=i % 2,
            key=f"key-{i}".encode(),
            correlation_id=f"c{i}",
            auto_compress=True,
        )
        for i in range(10)
    ]
    encodings = [r.headers["X-Msg-Encoding"].decode() for r in requests]
    compressed = all(len(r.value) < len(values[i]) for i, r in enumerate(requests))
    responses = [r async for r in lb.publish_bulk(requests)]
    subscribed = {
        str(n): await _take(
            lb.subscribe("bulk", partition=n, start_position=StartPosition.EARLIEST), 5
        )
        for n in (0, 1)
    }
    # Without waiting for acks: the request stream half-closes at once; every ack must still
    # arrive before the server ends the call.
    more = [
        lb.get_publish_request(b"late", stream="bulk", correlation_id=f"late{i}") for i in range(5)
    ]
    late = [r async for r in lb.publish_bulk(more, wait=False)]

    def response(r: Any) -> Observed:
        return {
            "correlation_id": r.correlationId,
            "has_error": r.HasField("asyncError"),
            "ack_stream": r.ack.stream,
            "ack_correlation_id": r.ack.correlationId,
            "ack_offset": r.ack.offset,
        }

    return {
        "encodings": encodings,
        "compressed": compressed,
        "values": [v.decode() for v in values],
        "responses": [response(r) for r in responses],
        "subscribed": subscribed,
        "late": [response(r) for r in late],
    }


async def scenario_unknown_stream(lb: Any, address: str) -> Observed:
    return {"publish": await _error(lb.publish(b"x", stream="no-such-stream"))}


async def scenario_oversized(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("big", wait_for_stream=True)
    # gufo logs RESOURCE_EXHAUSTED ("message size exceeded") and drops the message.
    dropped = await _error(lb.publish(b"x" * (300 * 1024), stream="big"))
    after = await lb.get_partition_metadata("big", 0)
    await lb.publish(b"small", stream="big")
    got = await _take(lb.subscribe("big", start_position=StartPosition.EARLIEST), 1)
    return {"dropped": dropped, "newest_after": after.newest_offset, "messages": got}


async def scenario_pause(lb: Any, address: str) -> Observed:
    from grpc.aio import insecure_channel
    from gufo.liftbridge.api_pb2 import PauseStreamRequest
    from gufo.liftbridge.api_pb2_grpc import APIStub

    await lb.create_stream("sleepy", wait_for_stream=True)
    await lb.publish(b"before", stream="sleepy")
    async with insecure_channel(address) as channel:
        await APIStub(channel).PauseStream(PauseStreamRequest(name="sleepy"), timeout=10)
    paused = (await lb.get_metadata("sleepy")).metadata[0].partitions[0]
    await lb.publish(b"after", stream="sleepy")
    awake = await lb.get_partition_metadata("sleepy", 0)
    return {
        "paused": [paused.paused, paused.newest_offset],
        "awake": [awake.paused, awake.newest_offset],
    }


async def scenario_cursors(lb: Any, address: str) -> Observed:
    from gufo.liftbridge.types import StartPosition

    await lb.create_stream("tracked", partitions=2, wait_for_stream=True)
    for i in range(10):
        await lb.publish(f"t{i}".encode(), stream="tracked")
    unknown = await lb.get_cursor("tracked", 0, "reader")
    after_set = []
    for i in range(10):
        await lb.set_cursor("tracked", 0, "reader", i)
        after_set.append(await lb.get_cursor("tracked", 0, "reader"))
    await lb.set_cursor("tracked", 0, "reader", 2)
    lowered = await lb.get_cursor("tracked", 0, "reader")
    other_partition = await lb.get_cursor("tracked", 1, "reader")
    other_id = await lb.get_cursor("tracked", 0, "other")
    await lb.set_cursor("tracked", 0, "reader", 4)
    resumed = await _take(
        lb.subscribe("tracked", start_position=StartPosition.RESUME, cursor_id="reader"), 2
    )
    cursors = (await lb.get_metadata("__cursors")).metadata[0].partitions[0]
    return {
        "unknown": unknown,
        "after_set": after_set,
        "lowered": lowered,
        "other_partition": other_partition,
        "other_id": other_id,
        "resumed": [[m["offset"], m["value"]] for m in resumed],
        "cursor_records": cursors.newest_offset + 1,
    }


async def scenario_cursors_after_restart(lb: Any, address: str) -> Observed:
    return {
        "reader": await lb.get_cursor("tracked", 0, "reader"),
        "other_partition": await lb.get_cursor("tracked", 1, "reader"),
    }


SCENARIOS: dict[str, Callable[[Any, str], Awaitable[Observed]]] = {
    name.removeprefix("scenario_"): function
    for name, function in dict(globals()).items()
    if name.startswith("scenario_")
}


TLS_VARIABLES = ("GUFO_TLS_CA", "GUFO_TLS_CERT", "GUFO_TLS_KEY")
"""PEM files a scenario's child connects with (mutual TLS), when the parent sets them."""


def _gufo_over_tls(ca: str, cert: str, key: str) -> None:
    """gufo 0.2.0 has no TLS parameter: ``GRPCChannel.connect`` calls ``grpc.aio.
    insecure_channel``, imported into ``gufo.liftbridge.client``. Replacing that one name with a
    secure channel of the same options leaves everything above the channel gufo's own."""
    import grpc
    import gufo.liftbridge.client as gufo_client

    def read(path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()

    credentials = grpc.ssl_channel_credentials(read(ca), read(key), read(cert))

    def secure_channel(target: str, options: Any = None, **rest: Any) -> Any:
        return grpc.aio.secure_channel(target, credentials, options=options, **rest)

    gufo_client.insecure_channel = secure_channel


async def _child(name: str, address: str) -> Observed:
    from gufo.liftbridge.client import LiftbridgeClient

    tls = [os.environ.get(variable) for variable in TLS_VARIABLES]
    if all(tls):
        _gufo_over_tls(*tls)  # type: ignore[arg-type]

    options: dict[str, Any] = {"compression_method": "lzma"} if name == "bulk" else {}
    async with LiftbridgeClient([address], **options) as lb:
        return await asyncio.wait_for(SCENARIOS[name](lb, address), CHILD_TIMEOUT - 10)


# ==================================================================================================
# The pytest side.
# ==================================================================================================

if __name__ != "__main__":
    import grpc
    import pytest
    from tests.support.server import ServerProcess, served

    from tidelog._proto.liftbridge import api_pb2 as pb
    from tidelog._proto.liftbridge import api_pb2_grpc as pb_grpc
    from tidelog.security.testca import issue, make_ca

    def gufo(server: ServerProcess, scenario: str, env: dict[str, str] | None = None) -> Observed:
        """Run one gufo scenario against ``server`` in a child interpreter; what it observed.
        ``env``: more environment variables for the child (``TLS_VARIABLES``)."""
        try:
            done = subprocess.run(
                [sys.executable, __file__, scenario, server.address],
                capture_output=True,
                text=True,
                timeout=CHILD_TIMEOUT,
                env={**os.environ, **(env or {})},
            )
        except subprocess.TimeoutExpired as expired:  # run() has killed the child by PID
            pytest.fail(f"gufo scenario {scenario!r} hung:\n{expired.stderr}")
        if done.returncode != 0:
            pytest.fail(f"gufo scenario {scenario!r} failed:\n{done.stderr[-4000:]}")
        result: Observed = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def wire_code(call: Callable[[pb_grpc.APIStub], object], server: ServerProcess) -> Any:
        with grpc.insecure_channel(server.address) as channel:
            try:
                call(pb_grpc.APIStub(channel))
            except grpc.RpcError as error:
                return error.code()
        return grpc.StatusCode.OK

    def test_gufo_and_tidelog_import_into_one_process() -> None:
        """A program may use gufo (Liftbridge's asyncio client) and tidelog's client side by side,
        e.g. while it migrates. Both generated modules register the ``proto`` package in
        protobuf's default descriptor pool; tidelog's under another file name
        (``liftbridge/api.proto``) and with extra fields, so the second import fails with
        ``duplicate symbol 'proto.StartPosition'``."""
        for first, second in (
            ("tidelog.client", "gufo.liftbridge.client"),
            ("gufo.liftbridge.client", "tidelog.client"),
        ):
            done = subprocess.run(
                [sys.executable, "-c", f"import {first}; import {second}"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, f"import {first}, then {second}:\n{done.stderr[-600:]}"

    # -- metadata and streams --------------------------------------------------------------------

    def test_metadata_has_one_broker_at_the_loopback_address_and_cursors(
        server: ServerProcess,
    ) -> None:
        seen = gufo(server, "metadata")
        ((broker_id, host, port),) = seen["brokers"]
        assert (host, port) == ("127.0.0.1", server.port)
        assert broker_id
        assert list(seen["streams"]) == ["__cursors"]
        assert seen["streams"]["__cursors"] == {
            "0": {
                "id": 0,
                "leader": broker_id,
                "replicas": [broker_id],
                "isr": [broker_id],
                "high_watermark": -1,
                "newest_offset": -1,
                "paused": False,
            }
        }
        # gufo resolved the leader of (__cursors, 0) to an address it can reach.
        assert seen["cursors_leader_address"] == server.address

    def test_create_stream_then_again_is_already_exists(server: ServerProcess) -> None:
        seen = gufo(server, "create")
        broker_id = seen["broker_id"]
        assert (seen["name"], seen["subject"]) == ("orders", "orders")
        assert sorted(seen["partitions"]) == ["0", "1", "2"]
        for number, partition in seen["partitions"].items():
            assert partition["id"] == int(number)
            assert partition["leader"] == broker_id
            assert partition["isr"] == [broker_id]
            assert (partition["high_watermark"], partition["newest_offset"]) == (-1, -1)
        assert seen["duplicate"]["type"] == "ErrorAlreadyExists"
        assert "already exists" in seen["duplicate"]["message"]
        assert seen["streams_after"] == ["__cursors", "compacted", "orders"]
        assert seen["partitions_after"] == [0, 1, 2]
        # gufo's enable_compact maps to compactEnabled, which tidelog accepts.
        assert seen["compacted"] is None
        assert (
            wire_code(
                lambda api: api.CreateStream(
                    pb.CreateStreamRequest(name="orders", subject="orders"), timeout=10
                ),
                server,
            )
            == grpc.StatusCode.ALREADY_EXISTS
        )

    def test_reserved_and_invalid_creates_and_unknown_deletes_on_the_wire(
        server: ServerProcess,
    ) -> None:
        for name in ("__cursors", "", "bad/name"):
            request = pb.CreateStreamRequest(name=name, subject=name)
            code = wire_code(lambda api, r=request: api.CreateStream(r, timeout=10), server)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, name
        request = pb.DeleteStreamRequest(name="_unknown_stream")
        code = wire_code(lambda api: api.DeleteStream(request, timeout=10), server)
        assert code == grpc.StatusCode.NOT_FOUND

    def test_delete_stream_removes_it_and_a_second_delete_is_not_found(
        server: ServerProcess,
    ) -> None:
        seen = gufo(server, "delete")
        assert seen["names_after_delete"] == ["__cursors"]
        assert seen["second_delete"]["type"] == "ErrorNotFound"
        assert "doomed" in seen["second_delete"]["message"]
        assert seen["recreated"] == [-1, -1]  # the name is free again; the new stream is empty

    # -- publish and subscribe -------------------------------------------------------------------

    def test_publish_with_headers_then_subscribe_from_earliest(server: ServerProcess) -> None:
        seen = gufo(server, "publish_subscribe")
        assert seen["empty"] == [-1, -1]
        got = seen["messages"]
        assert [m["offset"] for m in got] == list(range(10))
        assert [m["value"] for m in got] == [f"value-{i}" for i in range(10)]
        # tidelog does not inject Liftbridge's `subject`/`reply` headers.
        assert [m["headers"] for m in got] == [{"test": str(i)} for i in range(10)]
        assert {m["subject"] for m in got} == {"events"}
        assert {m["partition"] for m in got} == {0}
        assert {m["key"] for m in got} == {""}
        stamps = [m["timestamp"] for m in got]
        assert stamps == sorted(stamps)
        assert 0 < seen["now"] - stamps[-1] < 600 * 10**9  # ns since the epoch
        assert seen["full"] == [9, 9]

    def test_publish_and_subscribe_over_mutual_tls(tmp_path: Path) -> None:
        """gufo against a server that requires client certificates: its channel made secure
        (``_gufo_over_tls``; gufo itself has no TLS option), everything else unchanged."""
        pki = tmp_path / "pki"
        ca = make_ca(pki)
        server_cert, client_cert = issue(ca, pki, "server"), issue(ca, pki, "gufo-app")
        with served(
            tmp_path / "data",
            *("--tls-cert", str(server_cert.cert), "--tls-key", str(server_cert.key)),
            *("--tls-client-ca", str(ca.cert)),
        ) as secured:
            files = (ca.cert, client_cert.cert, client_cert.key)
            seen = gufo(
                secured, "publish_subscribe", dict(zip(TLS_VARIABLES, map(str, files), strict=True))
            )
            assert [(m["offset"], m["value"]) for m in seen["messages"]] == [
                (i, f"value-{i}") for i in range(10)
            ]
            assert seen["full"] == [9, 9]

    def test_subscribe_from_offset_latest_timestamp_and_new_only(server: ServerProcess) -> None:
        seen = gufo(server, "positions")
        assert seen["from_five"] == [5, 6, 7, 8, 9, 10]
        assert [(m["offset"], m["value"]) for m in seen["latest"]] == [(10, "m10")]
        assert seen["earliest"] == list(range(10))
        assert seen["by_time"] == [4, 5]
        assert seen["before_all"] == [0]
        new_only = seen["new_only"]
        assert new_only is not None, "a NEW_ONLY subscriber received nothing"
        assert new_only["offset"] >= 10  # nothing that was stored before
        assert new_only["value"] == f"new-{new_only['offset'] - 10}"

    def test_a_closed_subscription_does_not_stall_the_next_waiting_one(
        server: ServerProcess,
    ) -> None:
        seen = gufo(server, "resubscribe")
        assert seen["caught_up"] == [0, 1, 2]
        waiting = seen["waiting"]
        assert waiting is not None, (
            "a subscriber waiting for offset 3 received nothing while 100 messages were "
            "published, after an earlier live subscriber of the partition had disconnected"
        )
        assert (waiting["offset"], waiting["value"]) == (3, "b-0")

    def test_subscribe_reads_the_requested_partition(server: ServerProcess) -> None:
        seen = gufo(server, "partition")
        ((m),) = seen["messages"]
        assert (m["partition"], m["offset"], m["key"], m["value"]) == (2, 0, "k", "two")
        assert seen["newest"] == {"0": 0, "1": -1, "2": 0}

    def test_publish_bulk_over_publish_async_with_compression(server: ServerProcess) -> None:
        seen = gufo(server, "bulk")
        assert seen["encodings"] == ["lzma"] * 10
        assert seen["compressed"]
        responses = seen["responses"]
        assert [r["correlation_id"] for r in responses] == [f"c{i}" for i in range(10)]
        assert not any(r["has_error"] for r in responses)
        assert [(r["ack_stream"], r["ack_correlation_id"]) for r in responses] == [
            ("bulk", f"c{i}") for i in range(10)
        ]
        # Partition 0 got requests 0, 2, 4, ... at offsets 0..4; partition 1 likewise.
        assert [r["ack_offset"] for r in responses] == [i // 2 for i in range(10)]
        for number in (0, 1):
            got = seen["subscribed"][str(number)]
            mine = list(range(number, 10, 2))
            assert [m["offset"] for m in got] == [0, 1, 2, 3, 4]
            assert [m["key"] for m in got] == [f"key-{i}" for i in mine]
            assert [m["value"] for m in got] == [seen["values"][i] for i in mine]  # decompressed
            assert all(m["headers"] == {} for m in got)  # gufo pops its encoding header
        assert [(r["correlation_id"], r["ack_offset"]) for r in seen["late"]] == [
            (f"late{i}", 5 + i) for i in range(5)
        ]

    def test_publish_to_an_unknown_stream_raises_not_found(server: ServerProcess) -> None:
        seen = gufo(server, "unknown_stream")
        assert seen["publish"]["type"] == "ErrorNotFound"
        assert "no-such-stream" in seen["publish"]["message"]

    def test_oversized_publish_is_refused_and_nothing_is_written(server: ServerProcess) -> None:
        seen = gufo(server, "oversized")
        assert seen["dropped"] is None  # gufo swallows RESOURCE_EXHAUSTED by design
        assert seen["newest_after"] == -1
        assert [(m["offset"], m["value"]) for m in seen["messages"]] == [(0, "small")]
        request = pb.PublishRequest(stream="big", value=b"x" * (300 * 1024))
        code = wire_code(lambda api: api.Publish(request, timeout=10), server)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED

    def test_publish_without_a_deadline_is_acknowledged(server: ServerProcess) -> None:
        """gufo publishes without a call deadline; Liftbridge answers that with an empty
        response, tidelog with the ack (docs/api.md, "Differences from Liftbridge")."""
        with grpc.insecure_channel(server.address) as channel:
            api = pb_grpc.APIStub(channel)
            api.CreateStream(pb.CreateStreamRequest(name="acked", subject="acked"), timeout=10)
            for i in range(3):
                pending = api.Publish.future(pb.PublishRequest(stream="acked", value=b"v"))
                response = pending.result(timeout=10)  # bounds the wait, not the call
                assert (response.ack.stream, response.ack.offset) == ("acked", i)
            none = pb.PublishRequest(stream="acked", value=b"v", ackPolicy=pb.NONE)
            assert not api.Publish.future(none).result(timeout=10).HasField("ack")

    def test_pause_shows_in_metadata_and_a_publish_resumes(server: ServerProcess) -> None:
        seen = gufo(server, "pause")
        assert seen["paused"] == [True, 0]
        assert seen["awake"] == [False, 1]

    # -- cursors ---------------------------------------------------------------------------------

    def test_cursors_get_set_resume_and_survive_a_restart(server: ServerProcess) -> None:
        seen = gufo(server, "cursors")
        assert seen["unknown"] == -1  # gufo's "not set" value: the server's -1
        assert seen["after_set"] == [i + 1 for i in range(10)]  # gufo stores offset + 1
        assert seen["lowered"] == 3  # the last write wins
        assert (seen["other_partition"], seen["other_id"]) == (-1, -1)
        assert seen["resumed"] == [[5, "t5"], [6, "t6"]]  # RESUME after set_cursor(4)
        assert seen["cursor_records"] == 12  # one __cursors record per set
        server.restart()  # graceful (SIGTERM), then the same data dir on a new port
        after = gufo(server, "cursors_after_restart")
        assert after == {"reader": 5, "other_partition": -1}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(_child(sys.argv[1], sys.argv[2]))))
