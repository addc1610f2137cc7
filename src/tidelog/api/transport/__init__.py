"""tidelog's own gRPC server: HTTP/2 (the ``h2`` library) on asyncio, in place of grpcio's.

``server.py`` is the object ``tidelog.api.server`` registers services on and binds;
``connection.py`` one client connection (HTTP/2 frames, settings, flow control);
``call.py`` one call (requests in, handler task, responses coalesced out, trailers);
``context.py`` the servicer context handlers see; ``messages.py`` framing, timeouts, metadata
and status text; ``peer.py`` the caller's auth context in grpcio's form.

Chosen by the ``grpc_transport`` setting (``native``; ``grpcio`` by default), in one place:
``tidelog.api.server``.
"""

from tidelog.api.transport.server import NativeServer

__all__ = ["NativeServer"]
