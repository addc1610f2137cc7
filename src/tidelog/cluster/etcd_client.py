"""The etcd client a broker uses: aetcd's, over TLS when the cluster's URL is ``https://``.

aetcd opens a plaintext channel in ``Client.connect`` and takes no TLS material.
:class:`TlsEtcdClient` opens the channel with grpc's TLS credentials instead and sets up the same
stubs and watcher; every other call is aetcd's own.

Invariants. The URL's scheme decides: ``http://`` is plaintext and refuses TLS material (a CA or
a client certificate given for a plaintext etcd is a mistake, not a wish); ``https://`` is TLS,
with etcd's certificate checked against the given CA (the system's roots without one) and, when
given, this broker's client certificate presented. With etcd's ``--client-cert-auth`` and
authentication enabled, etcd names the broker's user after that certificate's common name: no
password is sent and no token refreshed.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final
from urllib.parse import urlsplit

import aetcd
import grpc
from aetcd import rpc, watcher

from tidelog.security import ClientTls, channel_credentials

DEFAULT_PORT: Final = 2379


def endpoint(url: str) -> tuple[str, int, bool]:
    """(host, port, TLS) of an etcd endpoint such as ``http://127.0.0.1:2379`` or
    ``https://etcd.example:2379``; a bare ``HOST:PORT`` is plaintext."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.scheme not in ("http", "https", "") or not parts.hostname:
        raise ValueError(f"an etcd endpoint looks like http(s)://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port or DEFAULT_PORT, parts.scheme == "https"


class TlsEtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd is untyped
    """aetcd's client whose channel is a TLS one (module docstring)."""

    def __init__(self, host: str, port: int, tls: ClientTls, timeout: float) -> None:
        super().__init__(host=host, port=port, timeout=timeout)
        # Read now: files that cannot be used stop the broker's start with their names.
        self._credentials = channel_credentials(tls.ca, tls.cert, tls.key)
        self._tls_options: list[tuple[str, Any]] = tls.options()

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]  # another task opens the channel
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        self._is_connecting = True
        try:
            self.channel = grpc.aio.secure_channel(
                f"{self._host}:{self._port}",
                self._credentials,
                options=[*self._options.items(), *self._tls_options],
            )
            # The same stubs aetcd's own connect sets up; no Authenticate call: etcd takes the
            # user from the client certificate.
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout)
            self._connected.set()
        finally:
            self._is_connecting = False


def etcd_client(url: str, tls: ClientTls, timeout: float = 5) -> aetcd.Client:
    """A client of the etcd at ``url`` (not yet connected): TLS for ``https://`` (module
    docstring). ``ValueError`` for TLS material given with an ``http://`` URL."""
    host, port, secure = endpoint(url)
    if not secure:
        if tls.secure:
            raise ValueError(
                f"etcd TLS settings (etcd_ca, etcd_cert) are given but the cluster URL {url!r} "
                f"is plaintext: write it https://HOST:PORT"
            )
        return aetcd.Client(host=host, port=port, timeout=timeout)
    return TlsEtcdClient(host, port, tls, timeout)


_REFUSED_OURS: Final = ("BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "UNKNOWN_CA")
"""What a TLS handshake failure says when etcd refused this broker's certificate (or its lack of
one): etcd's ``--client-cert-auth`` with a CA that did not sign ours."""
_REFUSED_THEIRS: Final = ("CERTIFICATE_VERIFY_FAILED", "certificate signature failure")
"""... and when this broker refused etcd's certificate."""


def unreachable(url: str, details: str) -> str:
    """What to tell an operator when the etcd at ``url`` could not be reached (grpc's
    ``details`` of the failure): a refused TLS handshake is named as such, with the setting
    to look at; anything else is an etcd that does not run or a wrong address."""
    if "handshake failed" not in details.lower():
        return f"etcd at {url} cannot be reached: check that it runs and the --cluster address"
    if any(mark in details for mark in _REFUSED_OURS):
        return (
            f"etcd at {url} refused this broker's TLS handshake: it requires a client "
            f"certificate signed by a CA it trusts (--client-cert-auth); set etcd_cert and "
            f"etcd_key to one ({details})"
        )
    if any(mark in details for mark in _REFUSED_THEIRS):
        return (
            f"etcd at {url} presented a certificate this broker does not trust: set etcd_ca to "
            f"the CA that signed it, and dial a host name the certificate names ({details})"
        )
    return f"the TLS handshake with etcd at {url} failed: is it serving TLS? ({details})"
