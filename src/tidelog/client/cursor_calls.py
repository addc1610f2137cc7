"""Cursors from the client: the offset a named reader (a consumer's commits, the routing
listener, the snapshot provider) got to in a partition, kept by the server in ``__cursors``.

:class:`CursorCalls` is mixed into :class:`~tidelog.client.AsyncClient`. A cursor lives in the
``__cursors`` partition that the CRC-32 of ``cursor_id,stream,partition`` picks, and in a cluster
each call goes to that partition's leader. Setting a cursor to an offset again changes nothing,
so both calls are retried while the server is unreachable (``tidelog.client.retry``).
"""

from __future__ import annotations

import zlib
from typing import Any, TypeVar

from tidelog._proto.liftbridge import api_pb2 as pb
from tidelog.client.leaders import LeaderRouter
from tidelog.client.retry import Attempt
from tidelog.wire import CURSORS_STREAM

T = TypeVar("T")


class CursorCalls:
    """The cursor calls of :class:`~tidelog.client.AsyncClient`."""

    _router: LeaderRouter

    async def _retrying(
        self,
        attempt: Attempt[T],
        timeout: float | None = None,
        *,
        route: tuple[str, int] | None = None,
        once: str | None = None,
    ) -> T:
        raise NotImplementedError  # provided by AsyncClient

    async def set_cursor(self, cursor_id: str, stream: str, partition: int, offset: int) -> None:
        request = pb.SetCursorRequest(
            cursorId=cursor_id, stream=stream, partition=partition, offset=offset
        )

        key = f"{cursor_id},{stream},{partition}".encode()

        async def attempt(timeout: float | None, number: int) -> None:
            await self._cursor_api(key).SetCursor(request, timeout=timeout)

        await self._retrying(attempt, route=await self._cursor_route(key))

    async def _cursor_route(self, key: bytes) -> tuple[str, int]:
        """The ``__cursors`` partition that keeps ``key`` (CRC-32 of it, as the server and
        Liftbridge place it), whose leader takes the call in a cluster. Its leaders are looked
        up before the first cursor call, as a stream's before its first publish: a client that
        never learnt it talks to a cluster could not leave a leader that died."""
        await self._router.ensure(CURSORS_STREAM)
        return CURSORS_STREAM, zlib.crc32(key) % self._router.partition_count(CURSORS_STREAM)

    def _cursor_api(self, key: bytes) -> Any:
        count = self._router.partition_count(CURSORS_STREAM)
        return self._router.api(CURSORS_STREAM, zlib.crc32(key) % count)

    async def fetch_cursor(self, cursor_id: str, stream: str, partition: int = 0) -> int:
        """The stored offset, or -1 when the cursor was never set."""
        request = pb.FetchCursorRequest(cursorId=cursor_id, stream=stream, partition=partition)

        key = f"{cursor_id},{stream},{partition}".encode()

        async def attempt(timeout: float | None, number: int) -> pb.FetchCursorResponse:
            answer: pb.FetchCursorResponse = await self._cursor_api(key).FetchCursor(
                request, timeout=timeout
            )
            return answer

        response = await self._retrying(attempt, route=await self._cursor_route(key))
        return int(response.offset)


__all__ = ["CursorCalls"]
