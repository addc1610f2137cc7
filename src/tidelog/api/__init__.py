"""The server's front: gRPC services that translate requests into broker calls and back.

Two services share one broker: ``proto.API`` (``liftbridge.py``), wire-compatible with
Liftbridge, and ``tidelog.v1`` (``v1.py``, with ``consume.py`` and the view queries), tidelog's
batched and columnar one. Both only translate: protobuf in, calls on the broker's face
(``tidelog.broker``) out, and broker results and errors back as messages and statuses. Nothing
here reads a log or keeps subscription state; that is the broker's.

``server.py`` runs them (health, metrics, graceful shutdown), ``settings.py`` is the server's one
settings object, ``decoding.py`` turns undecodable requests into INVALID_ARGUMENT, and the
module that maps errors to statuses holds the one table of that mapping.
"""
