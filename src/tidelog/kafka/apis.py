"""The Kafka apis served, with their version ranges: one table (``docs/kafka.md`` lists it).

Each entry names the handler that answers every version in its range. Ranges stop where a
version would need what tidelog does not have (Fetch v13+ and Produce v10+ name topics by id;
Metadata stays below the versions that drop topic names). ``ApiVersions`` answers from this
table, so a client never picks a version the handler does not serve.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from kio.schema.errors import ErrorCode

from tidelog.kafka import admin, fetch, groups, metadata, offsets, produce, sasl
from tidelog.kafka.protocol import API_VERSIONS_KEY, FrameStart, Request, answer, nested
from tidelog.kafka.session import Session

Handler = Callable[[Session, Request], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler


async def api_versions(session: Session, request: Request) -> Any:
    return _versions(request, ErrorCode.none)


def _versions(request: FrameStart | Request, error: ErrorCode) -> Any:
    keys = tuple(
        nested(
            request,
            "ApiVersion",
            api_key=a.key,
            min_version=a.min_version,
            max_version=a.max_version,
        )
        for a in sorted(APIS.values(), key=lambda a: a.key)
    )
    return answer(
        request,
        error_code=error,
        api_keys=keys,
        throttle_time=timedelta(0),
        supported_features=(),
        finalized_features_epoch=-1,
        finalized_features=(),
        zk_migration_ready=False,
    )


def unsupported(start: FrameStart) -> Any | None:
    """The answer to an api or version not served: for ``ApiVersions``, its version-0 answer
    with ``UNSUPPORTED_VERSION`` and the served ranges (KIP-511); None for any other api."""
    if start.api_key != API_VERSIONS_KEY:
        return None
    return _versions(
        FrameStart(start.api_key, 0, start.correlation_id), ErrorCode.unsupported_version
    )


_TABLE: Final = (
    Api(0, "Produce", 3, 9, produce.handle),
    Api(1, "Fetch", 4, 12, fetch.handle),
    Api(2, "ListOffsets", 1, 7, offsets.list_offsets),
    Api(3, "Metadata", 1, 12, metadata.handle),
    Api(18, "ApiVersions", 0, 4, api_versions),
    *(Api(*entry) for entry in admin.SERVED),
    *(Api(*entry) for entry in groups.SERVED),
    *(Api(*entry) for entry in sasl.SERVED),
)

APIS: Final[dict[int, Api]] = {}
for _api in _TABLE:
    APIS[_api.key] = _api

WAITING: Final = frozenset({1, 11, 14})
"""Apis whose handler waits on others (Fetch for data, JoinGroup for the rebalance, SyncGroup for
the assignment): cancelled when the client closes its connection meanwhile (``inbox.py``). Any
other runs to its end, so a write whose client went away is whole, for the client's retry on
another connection to find."""

AUTH_FREE: Final = frozenset({API_VERSIONS_KEY, *(entry[0] for entry in sasl.SERVED)})
"""Apis a connection may send before its SASL exchange completes."""
