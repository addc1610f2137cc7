"""The materialised-view RPCs of ``tidelog.v1``: declare, drop, list and query views."""

from __future__ import annotations

import grpc

from tidelog._proto.tidelog.v1 import tidelog_pb2 as v1
from tidelog._proto.tidelog.v1 import tidelog_pb2_grpc as v1_grpc

Context = grpc.aio.ServicerContext[object, object]

_NOT_YET = "materialised views are not built yet"


class ViewService(v1_grpc.TidelogServicer):
    """Answers the view RPCs; mixed into :class:`tidelog.api.v1.TidelogService`."""

    async def DeclareView(
        self, request: v1.DeclareViewRequest, context: Context
    ) -> v1.DeclareViewResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def DropView(self, request: v1.DropViewRequest, context: Context) -> v1.DropViewResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def ListViews(
        self, request: v1.ListViewsRequest, context: Context
    ) -> v1.ListViewsResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def ViewGet(self, request: v1.ViewGetRequest, context: Context) -> v1.ViewGetResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def ViewRange(
        self, request: v1.ViewRangeRequest, context: Context
    ) -> v1.ViewRangeResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")

    async def WindowFetch(
        self, request: v1.WindowFetchRequest, context: Context
    ) -> v1.WindowFetchResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, _NOT_YET)
        raise AssertionError("unreachable")
