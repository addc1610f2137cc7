"""Who is at the other end of a connection, in grpcio's words: ``auth_context`` and ``peer``.

grpcio's server hands a handler an auth context of lists of bytes. Over TLS with a verified
client certificate it holds ``transport_security_type`` (``ssl``), ``security_level``,
``x509_common_name``, ``x509_subject_alternative_name`` (one entry per name grpc writes out, in
the certificate's order, see ``tidelog.api.http.grpc_san``) and ``x509_pem_cert``; over TLS
without one, only the first two; on a plaintext port ``insecure`` and ``TSI_SECURITY_NONE``.
This module builds the same from the handshake's ``ssl.SSLObject``, once per connection, so
that the authenticator (``tidelog.security.identity``) names a caller the same on both
transports.
"""

from __future__ import annotations

import ssl
from typing import Any

from tidelog.api.http import grpc_san

AuthContext = dict[str, list[bytes]]

INSECURE: AuthContext = {
    "transport_security_type": [b"insecure"],
    "security_level": [b"TSI_SECURITY_NONE"],
}


def auth_context(tls: ssl.SSLObject | None) -> AuthContext:
    """The auth context of a connection (module docstring)."""
    if tls is None:
        return {key: list(value) for key, value in INSECURE.items()}
    context: AuthContext = {
        "transport_security_type": [b"ssl"],
        "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"],
    }
    certificate: Any = tls.getpeercert()
    if not certificate:
        return context
    sans = [grpc_san(kind, value) for kind, value in certificate.get("subjectAltName", ())]
    names = [
        str(value)
        for rdn in certificate.get("subject", ())
        for key, value in rdn
        if key == "commonName"
    ]
    context["x509_common_name"] = [name.encode() for name in names]
    if sans:
        context["x509_subject_alternative_name"] = [name.encode() for name in sans]
    der = tls.getpeercert(binary_form=True)
    if der:
        context["x509_pem_cert"] = [ssl.DER_cert_to_PEM_cert(der).encode()]
    return context
