"""TLS material: the server's certificate (reloaded on SIGHUP) and a client's channel credentials.

Server: :class:`ServerTls` reads a certificate chain, its key and, for mutual TLS, the CA that
signs client certificates. It hands grpc credentials whose configuration is fetched at each new
connection's handshake, so :meth:`ServerTls.reload` changes what new connections see without a
restart (open connections keep theirs, as with any TLS server), and an ``ssl.SSLContext`` for the
HTTP and Kafka ports whose handshakes switch to a context built from the material of their
moment (so a reload reaches them whole: a client CA taken out of the file is no longer trusted,
which refilling one context in place would not do, its trust store only growing). A reload that
cannot read or match the files raises :class:`TlsError` and keeps what was loaded.

With a client CA, a client certificate is required on every connection (mutual TLS); a client
that has none cannot connect. Without one, clients are not asked for one (server TLS: tokens
identify them).

Client: :func:`channel_credentials` builds grpc channel credentials from a CA, an optional
client certificate and key, and an optional bearer token (sent with every call).
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc


class TlsError(ValueError):
    """TLS files that cannot be used; the message names the file and what is wrong."""


def _read(path: Path, what: str) -> bytes:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TlsError(f"cannot read the {what} {path}: {error.strerror or error}") from None
    if b"-----BEGIN" not in data:
        raise TlsError(f"the {what} {path} is not PEM (no -----BEGIN line)")
    return data


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None


def _load_chain(context: ssl.SSLContext, files: TlsFiles) -> None:
    """``context.load_cert_chain`` that never asks for a passphrase: without a password
    callback OpenSSL prompts on the terminal, which would block the server's loop (at start, or
    in the SIGHUP handler) and then fail with an OSError naming nothing."""

    def encrypted() -> bytes:
        raise TlsError(
            f"the private key {files.key} is encrypted: tidelog reads keys without a "
            f"passphrase (decrypt it, e.g. `openssl pkey -in KEY -out KEY.plain`, kept 0600)"
        )

    try:
        context.load_cert_chain(files.cert, files.key, password=encrypted)
    except OSError as error:
        if isinstance(error, ssl.SSLError):
            raise
        raise TlsError(
            f"cannot load the certificate {files.cert} with the key {files.key}: "
            f"{error.strerror or error}"
        ) from None


@dataclass(frozen=True, slots=True)
class _Material:
    cert: bytes
    key: bytes
    client_ca: bytes | None


def _load(files: TlsFiles) -> _Material:
    cert = _read(files.cert, "certificate")
    key = _read(files.key, "private key")
    ca = _read(files.client_ca, "client CA") if files.client_ca is not None else None
    # The same check a handshake would make, now, with a message that names the files.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        _load_chain(context, files)
    except ssl.SSLError as error:
        raise TlsError(
            f"the certificate {files.cert} and the key {files.key} do not go together: "
            f"{error.reason or error}"
        ) from None
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode())
        except (ssl.SSLError, ValueError) as error:
            raise TlsError(f"the client CA {files.client_ca} is not usable: {error}") from None
    return _Material(cert, key, ca)


class ServerTls:
    """The server's TLS material (module docstring)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._material = _load(files)
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()
        self._currents: dict[tuple[str, ...], ssl.SSLContext] = {}
        """What :meth:`ssl_context`'s handshakes use, per ALPN offer: built at its first call,
        rebuilt by each reload."""

    @property
    def mutual(self) -> bool:
        return self.files.client_ca is not None

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        material = self._material
        return grpc.ssl_server_certificate_configuration(
            [(material.key, material.cert)], root_certificates=material.client_ca
        )

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(),
            self._fetch,  # type: ignore[arg-type]  # grpc documents None as "no change"
            require_client_authentication=self.mutual,
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Called by grpc (any thread) at each handshake: a new configuration once after a reload.
        with self._lock:
            pending, self._pending = self._pending, None
        return pending

    def ssl_context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        """A server context for the HTTP and Kafka ports (and the native gRPC port, with
        ``alpn=("h2",)``): each handshake on it switches, once the client's hello is read (with
        a server name or without), to the context of the material loaded last (module
        docstring), which offers the same ALPN protocols."""
        if alpn not in self._currents:
            self._currents[alpn] = self._new_context(alpn)
        context = self._new_context(alpn)
        context.sni_callback = self._switch_to(alpn)
        return context

    def _new_context(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if alpn:
            context.set_alpn_protocols(list(alpn))
        self._fill(context)
        return context

    def _switch_to(
        self, alpn: tuple[str, ...]
    ) -> Callable[[ssl.SSLObject | ssl.SSLSocket, str | None, ssl.SSLContext], None]:
        def switch(
            connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
        ) -> None:
            current = self._currents.get(alpn)
            if current is not None:
                connection.context = current

        return switch

    def _fill(self, context: ssl.SSLContext) -> None:
        _load_chain(context, self.files)
        if self.files.client_ca is not None:
            context.load_verify_locations(cadata=self._material.client_ca.decode())  # type: ignore[union-attr]
            context.verify_mode = ssl.CERT_REQUIRED

    def reload(self) -> None:
        """Read the files again; new connections use them. :class:`TlsError` keeps the old."""
        material = _load(self.files)
        with self._lock:
            self._material = material
            self._pending = self._configuration()
        for alpn in list(self._currents):
            self._currents[alpn] = self._new_context(alpn)


def channel_credentials(
    ca: Path | None,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
) -> grpc.ChannelCredentials:
    """Credentials for a TLS channel: the server verified against ``ca`` (the system's roots
    when None), a client certificate when ``cert`` and ``key`` are given, and ``token`` sent as
    ``authorization: Bearer`` with every call."""
    if (cert is None) != (key is None):
        raise TlsError("a client certificate needs its key, and a key its certificate")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "CA certificate") if ca is not None else None,
        private_key=_read(key, "client key") if key is not None else None,
        certificate_chain=_read(cert, "client certificate") if cert is not None else None,
    )
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token)
        )
    return credentials


@dataclass(frozen=True, slots=True)
class ClientTls:
    """How a client (or a broker calling another, or a site sending to another) secures its
    channels. Empty: plaintext. A token needs TLS: it is refused here rather than sent readable."""

    ca: Path | None = None
    """CA that signed the server's certificate; with ``enabled`` and no CA, the system's roots."""
    cert: Path | None = None
    key: Path | None = None
    token: str | None = field(default=None, repr=False)
    """Kept out of ``repr`` (logs, Spark's task descriptions, tracebacks): a token is a secret."""
    server_name: str | None = None
    """The name the server's certificate is checked for, when not the host dialled."""
    enabled: bool = False
    """TLS even without a CA (a server with a publicly trusted certificate)."""

    @property
    def secure(self) -> bool:
        return self.enabled or self.ca is not None or self.cert is not None

    def __post_init__(self) -> None:
        if self.token and not self.secure:
            raise TlsError(
                "a token is sent only over TLS: give the server's CA (--tls-ca, "
                "TIDELOG_TLS_CA), or --tls to use the system's roots"
            )
        if (self.cert is None) != (self.key is None):
            raise TlsError("a client certificate needs its key, and a key its certificate")

    def options(self) -> list[tuple[str, str | int]]:
        if self.secure and self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


PLAINTEXT = ClientTls()


def aio_channel(
    address: str, tls: ClientTls, options: list[tuple[str, str | int]]
) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``address``, with TLS when ``tls`` says so."""
    if not tls.secure:
        return grpc.aio.insecure_channel(address, options=options)
    credentials = channel_credentials(tls.ca, tls.cert, tls.key, tls.token)
    return grpc.aio.secure_channel(address, credentials, options=[*options, *tls.options()])
