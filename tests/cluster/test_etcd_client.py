"""The etcd client's choice of transport by URL, and what an operator is told when etcd cannot
be reached (``tidelog.cluster.etcd_client``), without an etcd."""

from __future__ import annotations

from pathlib import Path

import aetcd
import pytest

from tidelog.api.settings import InvalidSettings, load_settings
from tidelog.cluster.etcd_client import TlsEtcdClient, etcd_client, unreachable
from tidelog.security import PLAINTEXT, ClientTls
from tidelog.security.testca import make_ca

URL = "https://127.0.0.1:2379"
HANDSHAKE = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:2379: "


def test_the_scheme_decides_the_transport(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    assert type(etcd_client("http://127.0.0.1:2379", PLAINTEXT)) is aetcd.Client
    assert isinstance(etcd_client(URL, ClientTls(ca=ca.cert)), TlsEtcdClient)
    assert isinstance(etcd_client(URL, PLAINTEXT), TlsEtcdClient)  # the system's roots
    with pytest.raises(ValueError, match="https://HOST:PORT"):
        etcd_client("http://127.0.0.1:2379", ClientTls(ca=ca.cert))


@pytest.mark.parametrize(
    ("details", "said"),
    [
        ("failed to connect to all addresses; Connection refused", "cannot be reached"),
        (
            HANDSHAKE + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
            "error:10000412:SSL routines:OPENSSL_internal:SSLV3_ALERT_BAD_CERTIFICATE",
            "set etcd_cert and etcd_key",
        ),
        (
            HANDSHAKE + "Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: "
            "error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
            "set etcd_ca",
        ),
        (
            HANDSHAKE + "Tls handshake failed (TSI_PROTOCOL_FAILURE): WRONG_VERSION_NUMBER",
            "is it serving TLS?",
        ),
    ],
)
def test_a_refused_handshake_names_the_setting_to_look_at(details: str, said: str) -> None:
    assert said in unreachable(URL, details)


def test_etcd_tls_settings_need_an_https_url(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    with pytest.raises(InvalidSettings, match="https://HOST:PORT"):
        load_settings(cluster="http://127.0.0.1:2379", broker_id="b1", etcd_ca=ca)
    with pytest.raises(InvalidSettings, match="etcd_cert and etcd_key go together"):
        load_settings(cluster=URL, broker_id="b1", etcd_cert=ca)
    settings = load_settings(cluster=URL, broker_id="b1", etcd_ca=ca)
    assert settings.etcd_ca == ca
