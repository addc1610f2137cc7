#!/usr/bin/env python3
"""``make sites``: three tidelog sites on loopback, replicating to each other over mutual TLS,
until Ctrl-C.

Writes, once, a test CA and a certificate for each site and for ``admin`` in
``./tidelog-sites/tls`` (``tidelog.security.testca``: each certificate's first subject
alternative name is its name, so a site's certificate names its site id), an ACL granting each
site ``replicate`` on the sites and ``admin`` everything (a super-user), and each site's
settings (its certificate, the CA, the ACL, the two other sites). Starts ``tidelog serve`` three
times - sites ``a``, ``b`` and ``c`` on ports 9301, 9302 and 9303 (metrics off), data in
``./tidelog-sites/<site>`` - so a payload transmitted on any of them can go to the two others.
Prints how a client connects and how to try it, then waits; Ctrl-C (or SIGTERM) stops the three
servers gracefully. The data and the certificates stay for the next run.

    python scripts/sites.py [--base-port 9301] [--data-dir tidelog-sites]
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tidelog.security.testca import Issued, issue, make_ca

SITES = ("a", "b", "c")
ADMIN = "admin"
ACL = """# make sites: each site may replicate to the others; admin may do everything.
super_users = ["admin"]

[[rule]]
effect = "allow"
principals = [{sites}]
operations = ["replicate"]
resources = ["site:*"]
"""


def prepare(data_dir: Path, ports: dict[str, int]) -> dict[str, Path]:
    """The CA, the certificates, the ACL and each site's settings (certificates made once);
    site -> its settings file."""
    tls = data_dir / "tls"
    ca = Issued(tls / "ca.pem", tls / "ca.key")
    if not ca.cert.exists():
        ca = make_ca(tls)
    certs = {}
    for name in (*SITES, ADMIN):
        certs[name] = Issued(tls / f"{name}.pem", tls / f"{name}.key")
        if not certs[name].cert.exists():
            certs[name] = issue(ca, tls, name)
    acl = tls / "acl.toml"
    acl.write_text(ACL.format(sites=", ".join(f'"{site}"' for site in SITES)))
    configs = {}
    for site in SITES:
        others = "".join(
            f'{other} = "127.0.0.1:{ports[other]}"\n' for other in SITES if other != site
        )
        configs[site] = data_dir / f"{site}.toml"
        configs[site].write_text(
            f'site_id = "{site}"\n'
            f'tls_cert = "{certs[site].cert.resolve()}"\n'
            f'tls_key = "{certs[site].key.resolve()}"\n'
            f'tls_client_ca = "{ca.cert.resolve()}"\n'
            f'tls_ca = "{ca.cert.resolve()}"\n'
            f'acl_file = "{acl.resolve()}"\n'
            f"[sites]\n{others}"
        )
    return configs


def start(site: str, port: int, data_dir: Path, config: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tidelog.cli",
            "serve",
            "--config",
            str(config),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--data-dir",
            str(data_dir / site),
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
            # Keep reading its stdout so the server never blocks on a full pipe.
            threading.Thread(target=process.stdout.read, daemon=True).start()
            return process
        if not line and process.poll() is not None:
            break
    process.kill()
    raise SystemExit(f"site {site} did not start on port {port} (is the port free?)")


def main() -> None:
    parser = argparse.ArgumentParser(description="three replicating tidelog sites on loopback")
    parser.add_argument("--base-port", type=int, default=9301)
    parser.add_argument("--data-dir", type=Path, default=Path("tidelog-sites"))
    args = parser.parse_args()
    ports = {site: args.base_port + i for i, site in enumerate(SITES)}
    processes: list[subprocess.Popen[str]] = []
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        configs = prepare(args.data_dir, ports)
        for site in SITES:
            processes.append(start(site, ports[site], args.data_dir, configs[site]))
        tls = args.data_dir / "tls"
        print("three sites over mutual TLS, each declared on the others:")
        for site in SITES:
            print(f"  site {site}: 127.0.0.1:{ports[site]}  (data in {args.data_dir / site})")
        print(
            "a client connects with the admin certificate (a super-user in the ACL):\n"
            f"  export TIDELOG_TLS_CA={tls / 'ca.pem'} TIDELOG_TLS_CERT={tls / 'admin.pem'} "
            f"TIDELOG_TLS_KEY={tls / 'admin.key'}\n"
            "  (Python: tidelog.Client(address, settings=ClientSettings.from_env()))\n"
            f"try:  tidelog site transmit orders b,c hello --server 127.0.0.1:{ports['a']}\n"
            f"      tidelog site status --server 127.0.0.1:{ports['a']}\n"
            f"      tidelog tail __lrq_recv.orders.a --from earliest "
            f"--server 127.0.0.1:{ports['b']}\n"
            "Ctrl-C stops the three servers.",
            flush=True,
        )
        while not stop.is_set():
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        print("stopped the three sites")


if __name__ == "__main__":
    main()
