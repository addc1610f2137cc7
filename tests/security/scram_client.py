"""A SCRAM-SHA-256 client's side, from RFC 5802's formulas, for tests of the server's side."""

from __future__ import annotations

import base64
import hashlib
import hmac


def client_final(password: str, server_first: bytes, first_bare: str, header: str = "n,,") -> bytes:
    """The client-final message answering ``server_first`` (its salt and iteration count) for a
    client that sent ``header`` + ``first_bare`` and knows ``password``."""
    fields = dict(part.split("=", 1) for part in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields["s"]), int(fields["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    bare = f"c={base64.b64encode(header.encode()).decode()},r={fields['r']}"
    auth = f"{first_bare},{server_first.decode()},{bare}".encode()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{bare},p={base64.b64encode(proof).decode()}".encode()
