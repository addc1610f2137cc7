#!/usr/bin/env python3
"""A cluster of three brokers and etcd on loopback: what replication costs and how fast a
cluster recovers.

- ``publish_rf1_msgs_per_s``: messages of ``--size`` bytes published to a stream with one
  replica, acknowledged by the leader (``--publishers`` concurrent publishers, batches of
  ``--batch``), through ``tidelog.AsyncClient`` routed to the leader.
- ``publish_rf3_all_msgs_per_s``: the same into a stream with three replicas and minIsr 2,
  acknowledged only once every in-sync replica holds them (ack policy ALL); in the same run, with
  ``rf3_all_over_rf1`` (target: >= 0.5).
- ``failover_s``: while a publisher publishes with ack ALL, the leader is killed (SIGKILL); the
  time from the kill to the first acknowledged publish after it, with the default lease
  (``cluster_lease_ttl_s``, 3 s; target: <= 5 s). The killed broker stays down until it is
  measured: an idempotent ``publish_batch`` (the client retries it).
- ``failover_plain_s``: the same with plain ``publish`` (no producer id, ack ALL), which the
  client does not retry when it may have been stored: the application retries on each error,
  as one would (target: <= 5 s).
- ``failover_subscribe_s``: a subscriber reads the stream from its leader; the leader is killed
  and a message published after the kill; the time from the kill until the subscriber has it
  (the subscription reopens on the new leader by itself; target: <= 5 s).
- ``rejoin_s``: the killed broker is started again while a publisher publishes with ack ALL; the
  time from its ready line until it is back in every ISR of the stream (target: <= 10 s), with
  the process start beside it (``rejoin_start_s``).
- ``publish_rf3_all_tls_msgs_per_s``: the RF 3 ack ALL publish on a cluster secured as
  ``make cluster`` is (etcd over TLS with client certificates and its authentication on, brokers
  with mutual TLS between them and with the client, under an ACL), against the same on a
  plaintext cluster, alternately, ``--tls-rounds`` times each on fresh clusters (the rounds are
  listed); ``tls_rf3_all_ratio`` is the best secured round over the best plaintext one (target:
  >= 0.8). ``--tls-only`` runs only this comparison.
- ``replica_catchup_mb_per_s``: a follower is stopped, ``--catchup-mb`` of records are
  published, the follower is started again; megabytes of records per second from its ready line
  until it is back in the ISR with the leader's log end (target: >= 100); the process start is
  reported beside it (``catchup_follower_start_s``).

Prints one JSON object with those keys, the targets and the load average before and after.

``--ratio-rounds N`` runs only the RF 1 / RF 3 ack ALL comparison, ``N`` times on a fresh
cluster each, and reports for every round both rates, their ratio, the load average, and the
CPU each process spent per message (``/proc/PID/stat`` around each phase: the RF 3 leader,
each follower, and the client). ``--trees A,B`` alternates the brokers' code between source
trees (each a checkout whose ``src`` is put first on the brokers' ``PYTHONPATH``; the client is
this tree's), so two versions are measured interleaved, under the same load.

    python benchmarks/cluster.py [--messages 200000] [--size 100] [--batch 1000]
        [--publishers 4] [--catchup-mb 500] [--tls-only] [--tls-rounds 2]
        [--ratio-rounds N [--trees A,B]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from tidelog.client import AsyncClient, Client, ClientSettings
from tidelog.errors import TidelogError
from tidelog.process import EtcdTls, ServerProcess, enable_etcd_auth, running_etcd
from tidelog.security import PLAINTEXT, ClientTls, testca


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def cpu_s(pid: int) -> float:
    """User and system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Brokers:
    def __init__(
        self,
        root: Path,
        url: str,
        stack: ExitStack,
        env: Callable[[str], dict[str, str]] = lambda _broker: {},
    ) -> None:
        self.root = root
        self.url = url
        self.servers: dict[str, ServerProcess] = {}
        self.stack = stack
        self.env = env
        """A broker's own settings (its certificate), by broker id."""

    def start(self, broker_id: str) -> ServerProcess:
        server = ServerProcess(
            self.root / broker_id,
            "--cluster",
            self.url,
            "--broker-id",
            broker_id,
            env=self.env(broker_id),
        ).start()
        self.servers[broker_id] = server
        self.stack.callback(server.kill)
        return server

    def any_live(self) -> str:
        for server in self.servers.values():
            if server.process is not None and server.process.poll() is None:
                return server.address
        raise RuntimeError("no broker is running")


async def publish_rate(
    address: str,
    stream: str,
    args: argparse.Namespace,
    ack_all: bool,
    tls: ClientTls = PLAINTEXT,
) -> float:
    """Messages per second acknowledged, ``args.publishers`` publishers at once."""
    settings = ClientSettings(ack_all=ack_all, retry_budget_s=30, tls=tls)
    value = b"x" * args.size
    per_publisher = args.messages // args.publishers
    async with AsyncClient(address, settings=settings) as client:
        await client.publish_batch(stream, [value])  # routes to the leader, warms the path

        async def publisher(number: int) -> None:
            for sequence in range(per_publisher // args.batch):
                await client.publish_batch(
                    stream,
                    [value] * args.batch,
                    producer_id=f"bench-{number}",
                    producer_sequence=sequence,
                )

        started = time.perf_counter()
        await asyncio.gather(*(publisher(n) for n in range(args.publishers)))
        elapsed = time.perf_counter() - started
    return (per_publisher // args.batch) * args.batch * args.publishers / elapsed


def create(
    address: str, name: str, replicas: int, min_isr: int, tls: ClientTls = PLAINTEXT
) -> None:
    with Client(address, settings=ClientSettings(tls=tls)) as client:
        client.create_stream(name, replication_factor=replicas, min_isr=min_isr)


def leader_of(address: str, stream: str) -> str:
    with Client(address) as client:
        (partition,) = client.cluster_status(stream).partitions
        return partition.leader


def failover(brokers: Brokers, stream: str) -> tuple[str, float]:
    """Seconds from killing the leader to the next acknowledged idempotent publish with ack
    ALL; the killed broker (returned) stays down."""
    leader = leader_of(brokers.any_live(), stream)
    others = [s.address for b, s in brokers.servers.items() if b != leader]
    settings = ClientSettings(ack_all=True, retry_budget_s=60)
    with Client(others[0], settings=settings) as client:
        for n in range(10):
            client.publish_batch(stream, [b"before"], producer_id="failover", producer_sequence=n)
        killed = time.perf_counter()
        brokers.servers[leader].kill()
        client.publish_batch(stream, [b"after"], producer_id="failover", producer_sequence=10)
        took = time.perf_counter() - killed
    return leader, took


def failover_plain(brokers: Brokers, stream: str) -> tuple[str, float]:
    """Seconds from killing the leader to the next acknowledged plain publish (ack ALL), the
    application publishing again after each error; the killed broker stays down."""
    leader = leader_of(brokers.any_live(), stream)
    others = [s.address for b, s in brokers.servers.items() if b != leader]
    with Client(others[0], settings=ClientSettings(ack_all=True)) as client:
        for _ in range(10):
            client.publish(stream, b"before")
        killed = time.perf_counter()
        brokers.servers[leader].kill()
        while True:
            try:
                client.publish(stream, b"after")
                break
            except TidelogError:
                if time.perf_counter() - killed > 120:
                    raise
                time.sleep(0.05)
        took = time.perf_counter() - killed
    return leader, took


def failover_subscribe(brokers: Brokers, stream: str) -> tuple[str, float]:
    """Seconds from killing the leader until a subscriber that was reading from it has a
    message published after the kill; the killed broker stays down."""
    leader = leader_of(brokers.any_live(), stream)
    others = [s.address for b, s in brokers.servers.items() if b != leader]
    settings = ClientSettings(ack_all=True, retry_budget_s=60)
    got: queue.Queue[tuple[bytes, float]] = queue.Queue()
    opened = threading.Event()

    def read() -> None:
        with Client(others[1]) as reader:
            messages = reader.subscribe(stream, start="new")
            opened.set()
            for message in messages:
                got.put((message.value, time.perf_counter()))
                if message.value == b"subscribe-after":
                    return

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    opened.wait(30)
    with Client(others[0], settings=settings) as client:
        client.publish_batch(
            stream, [b"subscribe-before"], producer_id="subscriber", producer_sequence=0
        )
        while got.get(timeout=30)[0] != b"subscribe-before":
            pass
        killed = time.perf_counter()
        brokers.servers[leader].kill()
        client.publish_batch(
            stream, [b"subscribe-after"], producer_id="subscriber", producer_sequence=1
        )
    while True:
        value, at = got.get(timeout=120)
        if value == b"subscribe-after":
            return leader, at - killed


def rejoin(brokers: Brokers, stream: str, broker_id: str) -> dict[str, float]:
    """Start ``broker_id`` again while a publisher publishes with ack ALL; seconds from its
    ready line until it is in every ISR of ``stream``."""
    stop = threading.Event()

    def load() -> None:
        settings = ClientSettings(ack_all=True, retry_budget_s=60)
        with Client(brokers.any_live(), settings=settings) as client:
            sequence = 0
            while not stop.is_set():
                client.publish_batch(
                    stream, [b"l" * 100] * 100, producer_id="rejoin", producer_sequence=sequence
                )
                sequence += 1

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    try:
        time.sleep(1.0)
        launched = time.perf_counter()
        brokers.start(broker_id)
        started = time.perf_counter()
        with Client(brokers.any_live()) as client:
            while not all(broker_id in p.isr for p in client.cluster_status(stream).partitions):
                if time.perf_counter() - started > 120:
                    raise RuntimeError(f"{broker_id} was not back in the ISR in 120 s")
                time.sleep(0.05)
        took = time.perf_counter() - started
    finally:
        stop.set()
        thread.join(60)
    return {"rejoin_s": round(took, 2), "rejoin_start_s": round(started - launched, 2)}


def catchup(brokers: Brokers, stream: str, megabytes: int) -> dict[str, Any]:
    address = brokers.any_live()
    leader = leader_of(address, stream)
    follower = next(b for b in brokers.servers if b != leader)
    brokers.servers[follower].stop()
    value = b"c" * 1000
    batches = megabytes * 1000 // 1000
    with Client(brokers.servers[leader].address) as client:
        for _ in range(batches):
            client.publish_batch(stream, [value] * 1000, partition=0)
    launched = time.perf_counter()
    brokers.start(follower)
    started = time.perf_counter()  # from its ready line: the process start is not replication
    with Client(brokers.servers[leader].address) as client:
        while True:
            (p,) = client.cluster_status(stream).partitions
            if follower in p.isr and p.lag(follower) == 0:
                break
            if time.perf_counter() - started > 600:
                raise RuntimeError("the follower did not catch up in 600 s")
            time.sleep(0.05)
    took = time.perf_counter() - started
    return {
        "replica_catchup_mb_per_s": round(megabytes / took, 1),
        "catchup_s": round(took, 2),
        "catchup_follower_start_s": round(started - launched, 2),
    }


def rf3_fresh(root: Path, args: argparse.Namespace, secured: bool) -> float:
    """Messages per second of RF 3 ack ALL publishes on a fresh cluster under ``root``: plain,
    or ``secured`` as ``make cluster`` is (module docstring), the client then presenting a
    super-user's certificate over mutual TLS."""
    pki = root.parent / "pki"
    ca = testca.Issued(pki / "ca.pem", pki / "ca.key")
    if not ca.cert.exists():
        ca = testca.make_ca(pki)
        for name in ("etcd", "root", "b1", "b2", "b3", "admin"):
            testca.issue(ca, pki, name)
    acl = pki / "acl.toml"
    acl.write_text('super_users = ["b1", "b2", "b3", "admin"]\n')

    def settings(broker: str) -> dict[str, str]:
        cert, key = str(pki / f"{broker}.pem"), str(pki / f"{broker}.key")
        if not secured:
            return {}
        return {
            "TIDELOG_TLS_CERT": cert,
            "TIDELOG_TLS_KEY": key,
            "TIDELOG_TLS_CLIENT_CA": str(ca.cert),
            "TIDELOG_ACL_FILE": str(acl),
            "TIDELOG_ETCD_CA": str(ca.cert),
            "TIDELOG_ETCD_CERT": cert,
            "TIDELOG_ETCD_KEY": key,
        }

    etcd_tls = EtcdTls(pki / "etcd.pem", pki / "etcd.key", client_ca=ca.cert) if secured else None
    client = ClientTls(ca=ca.cert, cert=pki / "admin.pem", key=pki / "admin.key")
    if not secured:
        client = PLAINTEXT
    with ExitStack() as stack:
        url = stack.enter_context(running_etcd(root / "etcd", tls=etcd_tls))
        if secured:
            etcd_root = (pki / "root.pem", pki / "root.key")
            enable_etcd_auth(url, ca.cert, etcd_root, ["b1", "b2", "b3"], "/tidelog/")
        brokers = Brokers(root, url, stack, env=settings)
        for n in (1, 2, 3):
            brokers.start(f"b{n}")
        address = brokers.any_live()
        create(address, "rf3", 3, 2, tls=client)
        return asyncio.run(publish_rate(address, "rf3", args, ack_all=True, tls=client))


def tls_comparison(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """RF 3 ack ALL, plaintext then secured, ``args.tls_rounds`` times, each on a fresh cluster:
    the best of each (the machine's other load only ever slows a round down) and their ratio."""
    plain: list[float] = []
    secured: list[float] = []
    for round_ in range(args.tls_rounds):
        plain.append(rf3_fresh(root / f"plain-{round_}", args, secured=False))
        secured.append(rf3_fresh(root / f"tls-{round_}", args, secured=True))
    return {
        "publish_rf3_all_plain_msgs_per_s_rounds": [round(r) for r in plain],
        "publish_rf3_all_tls_msgs_per_s_rounds": [round(r) for r in secured],
        "publish_rf3_all_tls_msgs_per_s": round(max(secured)),
        "tls_rf3_all_ratio": round(max(secured) / max(plain), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--publishers", type=int, default=4)
    parser.add_argument("--catchup-mb", type=int, default=500)
    parser.add_argument(
        "--tls-only", action="store_true", help="only RF 3 ack ALL, plaintext and over TLS"
    )
    parser.add_argument("--tls-rounds", type=int, default=2)
    parser.add_argument(
        "--ratio-rounds",
        type=int,
        default=0,
        help="only RF 1 against RF 3 ack ALL, this many rounds, with CPU per message",
    )
    parser.add_argument(
        "--trees", default="", help="comma-separated source trees the brokers alternate between"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tidelog-cluster-bench-"))
    result: dict[str, Any] = {"load_before": loadavg()}
    if args.ratio_rounds:
        try:
            result["rounds"] = ratio_rounds(root, args)
            result["by_tree"] = summary(result["rounds"])
        finally:
            shutil.rmtree(root, ignore_errors=True)
        result["load_after"] = loadavg()
        result["settings"] = vars(args)
        print(json.dumps(result))
        return
    try:
        if not args.tls_only:
            main_run(root, args, result)
        result.update(tls_comparison(root / "tls", args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["load_after"] = loadavg()
    result["targets"] = {
        "rf3_all_over_rf1": ">= 0.5",
        "tls_rf3_all_ratio": ">= 0.8",
        "failover_s": "<= 5",
        "failover_plain_s": "<= 5",
        "failover_subscribe_s": "<= 5",
        "rejoin_s": "<= 10",
        "replica_catchup_mb_per_s": ">= 100",
    }
    result["settings"] = vars(args)
    print(json.dumps(result))


def ratio_rounds(root: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``args.ratio_rounds`` rounds of RF 1 then RF 3 ack ALL, each on a fresh cluster, the
    brokers' code alternating between ``args.trees`` (module docstring)."""
    trees = [t for t in args.trees.split(",") if t] or [""]
    rounds: list[dict[str, Any]] = []
    for number in range(args.ratio_rounds):
        for tree in trees:
            rounds.append(ratio_round(root / f"round-{number}-{len(rounds)}", args, tree))
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    return rounds


def summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per tree: the median of each round's ratio and of the RF 3 phase's CPU per message
    (leader, both followers, client, and all of them)."""
    out: dict[str, dict[str, float]] = {}
    for tree in dict.fromkeys(r["tree"] for r in rounds):
        mine = [r for r in rounds if r["tree"] == tree]
        cpu = [r["rf3_all_cpu_us_per_msg"] for r in mine]
        out[tree] = {
            "ratio": statistics.median(r["ratio"] for r in mine),
            "rf1_msgs_per_s": statistics.median(r["rf1_msgs_per_s"] for r in mine),
            "rf3_all_msgs_per_s": statistics.median(r["rf3_all_msgs_per_s"] for r in mine),
            "rf3_leader_us": statistics.median(c["leader"] for c in cpu),
            "rf3_followers_us": statistics.median(sum(c["others"]) for c in cpu),
            "rf3_total_us": statistics.median(
                c["leader"] + sum(c["others"]) + c["client"] for c in cpu
            ),
        }
    return out


def ratio_round(root: Path, args: argparse.Namespace, tree: str) -> dict[str, Any]:
    """RF 1 then RF 3 ack ALL on a fresh cluster whose brokers run ``tree``'s code (empty: the
    inherited path), with the CPU per message of each process in each phase."""
    env: dict[str, str] = {}
    if tree:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(tree) / "src"), os.environ.get("PYTHONPATH", "")]
        )
    with ExitStack() as stack:
        url = stack.enter_context(running_etcd(root / "etcd"))
        brokers = Brokers(root, url, stack, env=lambda _broker: env)
        for n in (1, 2, 3):
            brokers.start(f"b{n}")
        address = brokers.any_live()
        create(address, "rf1", 1, 1)
        create(address, "rf3", 3, 2)
        out: dict[str, Any] = {"tree": tree or ".", "load_before": loadavg()}
        for stream, ack_all, key in (("rf1", False, "rf1"), ("rf3", True, "rf3_all")):
            leader = leader_of(address, stream)
            pids = {b: s.pid for b, s in brokers.servers.items()}
            before = {b: cpu_s(pid) for b, pid in pids.items()}
            client_before = time.process_time()
            rate = asyncio.run(publish_rate(address, stream, args, ack_all=ack_all))
            client_cpu = time.process_time() - client_before
            spent = {b: cpu_s(pid) - before[b] for b, pid in pids.items()}
            messages = (args.messages // args.publishers // args.batch) * args.batch
            messages *= args.publishers
            out[f"{key}_msgs_per_s"] = round(rate)
            out[f"{key}_cpu_us_per_msg"] = {
                "leader": round(spent.pop(leader) / messages * 1e6, 2),
                "others": sorted(round(c / messages * 1e6, 2) for c in spent.values()),
                "client": round(client_cpu / messages * 1e6, 2),
            }
        out["ratio"] = round(out["rf3_all_msgs_per_s"] / out["rf1_msgs_per_s"], 3)
        out["load_after"] = loadavg()
        return out


def main_run(root: Path, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Everything but the TLS comparison, on one plaintext cluster (module docstring)."""
    with ExitStack() as stack:
        url = stack.enter_context(running_etcd(root / "etcd"))
        brokers = Brokers(root, url, stack)
        for n in (1, 2, 3):
            brokers.start(f"b{n}")
        address = brokers.any_live()
        create(address, "rf1", 1, 1)
        create(address, "rf3", 3, 2)
        rf1 = asyncio.run(publish_rate(address, "rf1", args, ack_all=False))
        rf3 = asyncio.run(publish_rate(address, "rf3", args, ack_all=True))
        result["publish_rf1_msgs_per_s"] = round(rf1)
        result["publish_rf3_all_msgs_per_s"] = round(rf3)
        result["rf3_all_over_rf1"] = round(rf3 / rf1, 3)
        more(brokers, args, result)


def more(brokers: Brokers, args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Failovers, a rejoin and a catch-up on the plaintext cluster (module docstring)."""
    killed, took = failover(brokers, "rf3")
    result["failover_s"] = round(took, 2)
    brokers.start(killed)
    killed, took = failover_plain(brokers, "rf3")
    result["failover_plain_s"] = round(took, 2)
    brokers.start(killed)
    killed, took = failover_subscribe(brokers, "rf3")
    result["failover_subscribe_s"] = round(took, 2)
    result.update(rejoin(brokers, "rf3", killed))
    create(brokers.any_live(), "catchup", 3, 1)
    result.update(catchup(brokers, "catchup", args.catchup_mb))


if __name__ == "__main__":
    main()
