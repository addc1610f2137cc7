"""The server's fronts: gRPC services that translate requests into calls on the control.

Two services share one control (``tidelog.control``): ``proto.API`` (``liftbridge.py``),
wire-compatible with Liftbridge, and ``tidelog.v1`` (``v1.py``, with ``consume.py``, the view,
site, browse and describe services), tidelog's batched and columnar one; beside them the
cluster's own ``Replication`` and ``ClusterAdmin`` (``replica_service.py``). They only
translate: protobuf in, calls on the control out, results back as messages. None of them knows
whether the server is one broker or a broker of a cluster; nothing here reads a log or keeps
subscription state.

Every call passes the guard (``guard.py``, after ``decoding.py``): what it touches is checked,
and what it raises becomes a status from the one table in ``status.py``. ``server.py`` runs the
services (health, metrics, graceful shutdown) and is the one place that picks the control;
``settings.py`` is the server's one settings object.
"""
