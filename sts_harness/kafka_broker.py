"""A local single-node Apache Kafka broker (KRaft) for the tests and ``sts demo --source
kafka``: the real broker, run from Apache Kafka's own Maven artifacts on loopback.

Its jars (``org.apache.kafka:kafka_2.13`` and what it depends on, ~45 MB) are resolved once
from Maven Central with the Ivy that PySpark ships, into
``$STS_CACHE_DIR/kafka/<version>`` (``scripts/install.sh`` does it:
``python -m sts_harness.kafka_broker --fetch``). The broker listens on 127.0.0.1 only,
one partition per topic by default, replication factor 1, and keeps its log in the folder
it is given, so a broker killed with ``kill()`` and started again keeps every record.

    with KafkaBroker(tmp / "kafka") as broker:
        print(broker.bootstrap_servers)      # 127.0.0.1:<port>
        broker.kill(); broker.start()        # a crash and a restart, same data
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sidecar import write_folder_atomically
from sts_harness.process import free_port

#: The broker's release. Kafka 4.x brokers run on Java 17; Spark's connector (kafka-clients
#: 3.9) talks to them.
KAFKA_VERSION = "4.1.1"
SCALA_BINARY = "2.13"
#: log4j2's SLF4J binding for the broker's SLF4J 1.7 API (without it the broker logs nothing).
LOG4J_VERSION = "2.24.3"
_IVY_XML = """<ivy-module version="2.0">
  <info organisation="sts-spark" module="kafka-broker"/>
  <dependencies>
    <dependency org="org.apache.kafka" name="kafka_{scala}" rev="{kafka}" conf="default->default"/>
    <dependency org="org.apache.logging.log4j" name="log4j-slf4j-impl" rev="{log4j}"
                conf="default->default"/>
  </dependencies>
</ivy-module>
"""
_LOG4J2 = """<Configuration status="WARN">
  <Appenders><Console name="out" target="SYSTEM_OUT">
    <PatternLayout pattern="%d{ISO8601} %p %c{1}: %m%n"/></Console></Appenders>
  <Loggers><Root level="WARN"><AppenderRef ref="out"/></Root>
    <Logger name="kafka.server.KafkaRaftServer" level="INFO"/></Loggers>
</Configuration>
"""


class KafkaBrokerError(RuntimeError):
    """The broker's jars could not be had, or the broker did not start. Unrecoverable."""


def cache_root() -> Path:
    return Path(os.environ.get("STS_CACHE_DIR") or Path.home() / ".cache" / "sts-spark")


def broker_jars(version: str = KAFKA_VERSION, *, fetch: bool = True) -> Path:
    """The folder holding the broker's jars, resolved from Maven Central when missing
    (``fetch``). The folder is filled under a hidden name and renamed
    (:func:`sidecar.write_folder_atomically`), so a broken download never looks complete.

    Raises:
        KafkaBrokerError: the jars are missing and cannot be resolved.
    """
    folder = cache_root() / "kafka" / version
    if (folder / f"kafka_{SCALA_BINARY}-{version}.jar").exists():
        return folder
    if not fetch:
        raise KafkaBrokerError(f"the Kafka broker's jars are not in {folder}: run "
                               "python -m sts_harness.kafka_broker --fetch")
    import pyspark

    ivy = next(iter(sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))), None)
    if ivy is None:
        raise KafkaBrokerError("PySpark ships no Ivy jar to resolve the broker with")

    def resolve(staging: Path) -> None:
        ivy_xml = staging / "ivy.xml"
        ivy_xml.write_text(_IVY_XML.format(scala=SCALA_BINARY, kafka=version,
                                           log4j=LOG4J_VERSION), encoding="utf-8")
        proc = subprocess.run(
            [_java(), "-jar", str(ivy), "-ivy", str(ivy_xml), "-m2compatible", "-confs",
             "default", "-cache", str(cache_root() / "ivy-cache"),
             "-retrieve", str(staging / "[artifact]-[revision](-[classifier]).[ext]")],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not (staging / f"kafka_{SCALA_BINARY}-{version}.jar").exists():
            tail = " | ".join(line.strip() for line in proc.stdout.splitlines()[-4:])
            raise KafkaBrokerError(f"could not resolve org.apache.kafka:kafka_{SCALA_BINARY}:"
                                   f"{version} from Maven Central: {tail}")
        ivy_xml.unlink()

    write_folder_atomically(folder, resolve)  # a folder another run finished first is kept
    return folder


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise KafkaBrokerError("no java found (JAVA_HOME or PATH): the broker needs Java 17+")
    return str(java)


class KafkaBroker:
    """A single-node KRaft broker (broker and controller in one JVM) on 127.0.0.1.

    Args:
        work_dir: Its folder: the log (``data/``), ``server.properties``, ``broker.log``.
            Reused across ``kill()``/``start()``; created when missing.
        port: The client port (default: a free one, kept across restarts).
        heap_mb: The JVM's heap.
        start_timeout_s: How long ``start()`` waits for the broker to answer.
    """

    def __init__(self, work_dir: Path, *, port: int | None = None, heap_mb: int = 512,
                 start_timeout_s: float = 60.0) -> None:
        self.work_dir = Path(work_dir)
        self.port = port or free_port()
        self.controller_port = free_port()
        self.heap_mb = heap_mb
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "broker.log"

    def _properties(self) -> Path:
        path = self.work_dir / "server.properties"
        path.write_text("\n".join([
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.work_dir / 'data'}",
            "num.partitions=1",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "group.initial.rebalance.delay.ms=0",
            "auto.create.topics.enable=true",
            "log.flush.interval.messages=1",
            "",
        ]), encoding="utf-8")
        return path

    def _classpath(self) -> str:
        return str(broker_jars() / "*")

    def _format(self, properties: Path) -> None:
        if (self.work_dir / "data" / "meta.properties").exists():
            return  # formatted by an earlier start: keep its records
        proc = subprocess.run(
            [_java(), "-cp", self._classpath(), "kafka.tools.StorageTool", "format",
             "-t", _cluster_id(), "-c", str(properties)],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise KafkaBrokerError(f"formatting the broker's log failed: {proc.stderr.strip()}")

    def start(self) -> "KafkaBroker":
        """Start the broker (again, after ``kill()``/``stop()``) and wait until it answers.

        Raises:
            KafkaBrokerError: it exited or did not answer within ``start_timeout_s``.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        properties = self._properties()
        self._format(properties)
        log4j = self.work_dir / "log4j2.xml"
        log4j.write_text(_LOG4J2, encoding="utf-8")
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [_java(), f"-Xmx{self.heap_mb}m", "-XX:TieredStopAtLevel=1",
             f"-Dlog4j2.configurationFile={log4j}", "-cp", self._classpath(), "kafka.Kafka",
             str(properties)],
            stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            process_group=0)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        """Until the port accepts connections and the broker answers a metadata request
        (the port opens a little before the broker serves)."""
        import socket

        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + self.start_timeout_s
        admin = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise KafkaBrokerError(f"the Kafka broker exited with {self.proc.returncode}: "
                                       f"{self.tail_log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                # librdkafka logs every refused connection; the socket check keeps it quiet
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap_servers,
                                              "log_level": 0})
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # noqa: BLE001 - not answering yet
                time.sleep(0.2)
        self.stop()
        raise KafkaBrokerError(f"the Kafka broker did not answer in {self.start_timeout_s:.0f} s: "
                               f"{self.tail_log()}")

    def tail_log(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def kill(self) -> None:
        """SIGKILL: the broker dies at once, as in a crash (its log stays)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close_log()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, a clean shutdown; SIGKILL after ``timeout_s``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _cluster_id() -> str:
    """A KRaft cluster id: a UUID as 22 characters of URL-safe base64, never starting
    with ``-`` (the storage tool would read it as an option; Kafka's own
    ``Uuid.randomUuid`` draws again for the same reason).

    Example:
        >>> all(not _cluster_id().startswith("-") for _ in range(500))
        True
    """
    import base64

    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
           ).startswith("-"):
        pass
    return cid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sts_harness.kafka_broker",
                                     description="a local Kafka broker (KRaft) for tests and the demo")
    parser.add_argument("--fetch", action="store_true", help="resolve the broker's jars now")
    parser.add_argument("--serve", metavar="DIR", help="run a broker on loopback in DIR until Ctrl-C")
    args = parser.parse_args(argv)
    try:
        if args.fetch:
            print(broker_jars())
        if args.serve:
            with KafkaBroker(Path(args.serve)) as broker:
                print(f"Kafka broker (local) on {broker.bootstrap_servers}", flush=True)
                assert broker.proc is not None
                broker.proc.wait()
    except KafkaBrokerError as e:
        print(f"sts: {e} (sts_harness.kafka_broker)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
