"""A cluster for tests with TLS: a throwaway CA (``tidelog.security.testca``), etcd over TLS with
client certificates (and its authentication on: a user per broker, named by the certificate's
common name), brokers with mutual TLS and an ACL whose super-users are the brokers and ``admin``.
The test's own channels present ``admin``'s certificate. Everything is killed by PID and lives
under the test's temporary directory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from tests.cluster.clustertools import FAST, Cluster

from tidelog.process import EtcdTls, ServerProcess, enable_etcd_auth, running_etcd
from tidelog.security import testca

BROKERS = ("b1", "b2", "b3")


@dataclass(frozen=True)
class Pki:
    directory: Path
    ca: testca.Issued

    def issued(self, name: str) -> testca.Issued:
        """``name``'s certificate (issued on first use): first SAN and common name ``name``."""
        cert = testca.Issued(self.directory / f"{name}.pem", self.directory / f"{name}.key")
        return cert if cert.cert.exists() else testca.issue(self.ca, self.directory, name)

    def credentials(self, name: str) -> grpc.ChannelCredentials:
        mine = self.issued(name)
        return grpc.ssl_channel_credentials(
            self.ca.cert.read_bytes(), mine.key.read_bytes(), mine.cert.read_bytes()
        )


def make_pki(directory: Path) -> Pki:
    return Pki(directory, testca.make_ca(directory))


def write_acl(path: Path, super_users: list[str]) -> Path:
    names = ", ".join(f'"{name}"' for name in super_users)
    path.write_text(f"super_users = [{names}]\n")
    return path


class TlsCluster(Cluster):
    """:class:`Cluster` whose brokers serve mutual TLS (each with its own certificate) and whose
    channels are the ``admin`` principal's."""

    def __init__(self, root: Path, url: str, env: dict[str, str], pki: Pki) -> None:
        super().__init__(root, url, env)
        self.pki = pki

    def broker_env(self, broker_id: str) -> dict[str, str]:
        mine = self.pki.issued(broker_id)
        return {
            **self.env,
            "TIDELOG_TLS_CERT": str(mine.cert),
            "TIDELOG_TLS_KEY": str(mine.key),
            "TIDELOG_TLS_CLIENT_CA": str(self.pki.ca.cert),
            "TIDELOG_ETCD_CA": str(self.pki.ca.cert),
            "TIDELOG_ETCD_CERT": str(mine.cert),
            "TIDELOG_ETCD_KEY": str(mine.key),
        }

    def start(self, broker_id: str) -> ServerProcess:
        server = ServerProcess(
            self.root / broker_id,
            "--cluster",
            self.url,
            "--broker-id",
            broker_id,
            env=self.broker_env(broker_id),
        ).start()
        self.servers[broker_id] = server
        return server

    def channel(self, broker_id: str) -> grpc.Channel:
        address = self.servers[broker_id].address
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.secure_channel(address, self.pki.credentials("admin"))
            self._channels[address] = channel
        return channel


@contextlib.contextmanager
def running_tls_cluster(
    root: Path,
    brokers: int = 3,
    env: dict[str, str] | None = None,
) -> Iterator[TlsCluster]:
    """etcd over TLS with client certificates and its authentication on, and ``brokers``
    brokers with mutual TLS and an ACL: brokers and ``admin`` are super-users, nobody else may
    do anything."""
    pki = make_pki(root / "pki")
    ids = [f"b{n}" for n in range(1, brokers + 1)]
    acl = write_acl(root / "acl.toml", [*ids, "admin"])
    etcd_files = EtcdTls(*_pair(pki.issued("etcd")), client_ca=pki.ca.cert)
    with running_etcd(root / "etcd", tls=etcd_files) as url:
        enable_etcd_auth(url, pki.ca.cert, _pair(pki.issued("root")), ids, "/tidelog/default/")
        full_env = {**FAST, **(env or {}), "TIDELOG_ACL_FILE": str(acl)}
        cluster = TlsCluster(root, url, full_env, pki)
        try:
            for broker_id in ids:
                cluster.start(broker_id)
            yield cluster
        finally:
            cluster.close()


def _pair(issued: testca.Issued) -> tuple[Path, Path]:
    return issued.cert, issued.key
