"""The ``ssl.SSLContext`` of the HTTP and Kafka ports after a reload: a client CA taken out of
``tls_client_ca`` is no longer trusted by new connections (a context refilled in place would
have kept it, its trust store only growing), and the one put in is."""

from __future__ import annotations

import ssl
from pathlib import Path

from tidelog.security import ServerTls, TlsFiles
from tidelog.security.testca import Issued, issue, make_ca


def handshake(server: ssl.SSLContext, ca: Path, client: Issued) -> bool:
    """Whether a client presenting ``client``'s certificate completes a handshake (in memory)
    with ``server``."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(client.cert, client.key)
    client_side = context.wrap_bio(to_client, to_server, server_hostname="localhost")
    server_side = server.wrap_bio(to_server, to_client, server_side=True)
    pending = [client_side, server_side]
    try:
        for _ in range(10):
            for side in list(pending):
                try:
                    side.do_handshake()
                    pending.remove(side)
                except ssl.SSLWantReadError:
                    pass
            if not pending:
                break
    except ssl.SSLError:
        return False
    return not pending


def test_a_client_ca_taken_out_is_no_longer_trusted_after_a_reload(tmp_path: Path) -> None:
    old_ca = make_ca(tmp_path / "old", common_name="old CA")
    new_ca = make_ca(tmp_path / "new", common_name="new CA")
    server = issue(old_ca, tmp_path / "old", "server")
    old_client = issue(old_ca, tmp_path / "old", "alice")
    new_client = issue(new_ca, tmp_path / "new", "alice")
    client_ca = tmp_path / "client-ca.pem"
    client_ca.write_bytes(old_ca.cert.read_bytes())
    tls = ServerTls(TlsFiles(server.cert, server.key, client_ca))
    context = tls.ssl_context()
    assert handshake(context, old_ca.cert, old_client)
    assert not handshake(context, old_ca.cert, new_client)
    client_ca.write_bytes(new_ca.cert.read_bytes())
    tls.reload()
    assert not handshake(context, old_ca.cert, old_client)
    assert handshake(context, old_ca.cert, new_client)
