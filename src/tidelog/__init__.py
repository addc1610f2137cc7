"""tidelog: a durable, partitioned streaming log.

Layers (imports go down only; ``tests/test_layering.py`` holds the code to it): ``cli`` ->
``api`` -> ``broker`` -> ``log`` / ``store``. The api uses the broker's face (``tidelog.broker``)
only. ``client`` and ``spark`` talk to a server over gRPC and import none of those. At the bottom,
shared by all: ``errors``, ``wire``, ``columns``, ``_proto``, ``process``. ``docs/architecture.md``
traces one publish and one subscribe through them.

``tidelog.Client`` / ``tidelog.AsyncClient`` and ``tidelog.Message`` are the client's; they load
on first use, so importing ``tidelog.log`` alone does not pull in gRPC.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tidelog")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

from typing import Any

__all__ = ["AsyncClient", "Client", "ClientSettings", "Message", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("AsyncClient", "Client", "ClientSettings", "Message"):
        from tidelog import client

        return getattr(client, name)
    raise AttributeError(f"module 'tidelog' has no attribute {name!r}")
