"""Soak: producers, consumers, hostile connections, broker SIGKILLs and ingest runs at once.

For ``--minutes`` (default 2) this runs, against one real broker on 127.0.0.1:

- ``--producers`` confluent-kafka producers (acks=all, idempotence on, lz4, keyed), each
  writing unique values ``p<i>-<seq>`` to ``--partitions`` partitions, paced to ``--rate``
  records/s in all; every delivery report is kept (acknowledged = delivered without error);
- a consumer reading every partition from the start the whole time;
- hostile connections: a size prefix of ~100 MB and nothing else, a slow half-written
  header, garbage bytes; up to ``--hostile`` of them open at once, re-opened as the broker
  closes them or restarts;
- a broker SIGKILL and restart (same port, same log dir) every ``--kill-every`` seconds;
- ``spark-submit jobs/ingest.py`` runs back to back into one lake; every other run is
  SIGKILLed after a random delay (a crashed ingest must leave nothing behind that a later
  run duplicates).

Then producers flush, the broker is stopped cleanly and started again, a last ingest runs,
and three sets are compared: acknowledged (delivery reports), readable (a fresh consumer
reading every partition to its end), ingested (the ``records`` Delta table read with
delta-rs). Lost = acknowledged but not readable, or readable but not ingested; duplicated =
a value present twice in the log or in the lake, or an offset present twice in the lake.

Printed: counts, lost, duplicated, the broker's peak RSS (sampled every 0.2 s over all its
incarnations), produce latency p50/p99 (produce() to delivery report, over acknowledged
records), kills, ingest runs. Last line one JSON object; exit 1 when anything was lost or
duplicated.

    .venv/bin/python tests/perf/bench_soak.py [--minutes 2] [--producers 3] [--rate 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from tests.fixtures.broker import BrokerProcess  # noqa: E402

TOPIC = "soak"


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.broker = BrokerProcess(
            work / "broker",
            **{
                "num.partitions": str(args.partitions),
                "log.segment.bytes": str(4 << 20),
                "log.flush.interval.ms": "1000",
            },
        )
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int]] = {}  # value -> (partition, offset)
        self.failed = 0
        self.latencies: list[float] = []
        self.peak_rss_kib = 0
        self.kills = 0
        self.ingest_runs = 0
        self.ingest_killed = 0
        self.ingest_failures: list[str] = []
        self.hostile_opened = 0
        self.consumed = 0
        self.threads: list[threading.Thread] = []

    # -- workers ---------------------------------------------------------------------------

    def producer(self, index: int) -> None:
        p = ck.Producer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "log_level": 0,  # reconnect chatter while the broker is down
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 5,
                "message.timeout.ms": 300_000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        per_second = self.args.rate / self.args.producers
        seq = 0
        start = time.monotonic()

        def report(err: Any, msg: Any, sent: float) -> None:
            if err is None:
                with self.lock:
                    self.acked[msg.value()] = (msg.partition(), msg.offset())
                    self.latencies.append(time.monotonic() - sent)
            else:
                with self.lock:
                    self.failed += 1

        while not self.stop.is_set():
            target = start + seq / per_second
            now = time.monotonic()
            if now < target:
                p.poll(min(target - now, 0.05))
                continue
            value = f"p{index}-{seq}".encode()
            try:
                p.produce(
                    TOPIC,
                    key=value,
                    value=value,
                    on_delivery=lambda err, msg, sent=now: report(err, msg, sent),
                )
                seq += 1
            except BufferError:
                p.poll(0.1)
            p.poll(0)
        p.flush(300)

    def consumer(self) -> None:
        c = ck.Consumer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "log_level": 0,  # reconnect chatter while the broker is down
                "group.id": "soak-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        c.assign([ck.TopicPartition(TOPIC, p, 0) for p in range(self.args.partitions)])
        while not self.stop.is_set():
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    self.consumed += 1
        c.close()

    def hostile(self) -> None:
        opened: list[socket.socket] = []
        rng = random.Random(7)
        while not self.stop.is_set():
            opened = [s for s in opened if _alive(s)]
            while len(opened) < self.args.hostile and not self.stop.is_set():
                kind = rng.randrange(3)
                try:
                    s = socket.create_connection(("127.0.0.1", self.broker.port), timeout=1)
                    s.setblocking(False)
                    if kind == 0:
                        s.send((104_857_000).to_bytes(4, "big"))  # a big frame, never sent
                    elif kind == 1:
                        s.send(b"\x00\x00")  # half a size prefix
                    else:
                        s.send(os.urandom(64))
                    opened.append(s)
                    self.hostile_opened += 1
                except OSError:
                    time.sleep(0.2)
                    break
            time.sleep(0.5)
        for s in opened:
            s.close()

    def rss_sampler(self) -> None:
        while not self.stop.is_set():
            proc = self.broker.proc
            if proc is not None and proc.poll() is None:
                self.peak_rss_kib = max(self.peak_rss_kib, _rss_kib(proc.pid))
            time.sleep(0.2)

    def killer(self) -> None:
        while not self.stop.wait(self.args.kill_every):
            self.broker.kill()
            self.kills += 1
            try:
                self.broker.start()
            except RuntimeError as exc:
                print(f"broker restart failed: {exc}", file=sys.stderr)
                self.stop.set()

    def ingester(self) -> None:
        rng = random.Random(11)
        while not self.stop.is_set():
            kill_after = rng.uniform(3, 15) if self.ingest_runs % 2 == 1 else None
            code = self.ingest(kill_after=kill_after)
            self.ingest_runs += 1
            if kill_after is not None and code == -signal.SIGKILL:
                self.ingest_killed += 1
            elif code != 0:
                self.ingest_failures.append(f"run {self.ingest_runs}: exit {code}")
            self.stop.wait(2)

    # -- helpers ---------------------------------------------------------------------------

    def ingest(self, *, kill_after: float | None = None) -> int:
        import pyspark

        spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
        cmd = [
            str(spark_submit),
            "--master",
            "local[2]",
            "--properties-file",
            str(ROOT / "conf" / "spark-defaults.conf"),
            str(ROOT / "jobs" / "ingest.py"),
            "--config",
            str(ROOT / "conf" / "pipeline.toml"),
            "--log-dirs",
            str(self.broker.log_dir),
            "--lake",
            str(self.work / "lake"),
        ]
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        with (self.work / "ingest.log").open("ab") as out:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                return proc.wait(timeout=kill_after)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return -signal.SIGKILL

    def read_all(self) -> list[tuple[int, int, bytes]]:
        """Every record of every partition, read to its end by a fresh consumer."""
        c = ck.Consumer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "log_level": 0,  # reconnect chatter while the broker is down
                "group.id": "soak-final",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
        c.assign([ck.TopicPartition(TOPIC, p, 0) for p in range(self.args.partitions)])
        out: list[tuple[int, int, bytes]] = []
        at_end: set[int] = set()
        idle_until = time.monotonic() + 60
        while len(at_end) < self.args.partitions and time.monotonic() < idle_until:
            for m in c.consume(1000, 1.0):
                if m.error() is not None:
                    if m.error().code() == ck.KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                    continue
                out.append((m.partition(), m.offset(), m.value()))
                idle_until = time.monotonic() + 60
        c.close()
        if len(at_end) < self.args.partitions:
            raise RuntimeError(f"could not read partitions to their end: {at_end}")
        return out

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.broker.start()
        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        admin.create_topics([NewTopic(TOPIC, self.args.partitions, 1)])[TOPIC].result(30)
        workers = [
            *(
                threading.Thread(target=self.producer, args=(i,), name=f"producer-{i}")
                for i in range(self.args.producers)
            ),
            threading.Thread(target=self.consumer, name="consumer"),
            threading.Thread(target=self.hostile, name="hostile"),
            threading.Thread(target=self.rss_sampler, name="rss"),
            threading.Thread(target=self.killer, name="killer"),
            threading.Thread(target=self.ingester, name="ingester"),
        ]
        started = time.monotonic()
        for t in workers:
            t.start()
        self.stop.wait(self.args.minutes * 60)
        self.stop.set()
        for t in workers:
            t.join(timeout=600)
        soak_seconds = time.monotonic() - started
        # A clean stop, a clean start, then the final reads.
        code = self.broker.stop()
        self.broker.start()
        readable = self.read_all()
        self.broker.stop()
        final_ingest = self.ingest()
        return self.compare(readable, final_ingest, code, soak_seconds)

    def compare(
        self, readable: list[tuple[int, int, bytes]], final_ingest: int, stop_code: int, secs: float
    ) -> dict[str, Any]:
        from deltalake import DeltaTable

        table = DeltaTable(str(self.work / "lake" / "records")).to_pyarrow_table(
            columns=["partition", "offset", "value"]
        )
        lake = list(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
        log_values = Counter(v for _, _, v in readable)
        lake_values = Counter(v for _, _, v in lake)
        lake_offsets = Counter((p, o) for p, o, _ in lake)
        readable_set = {(p, o, v) for p, o, v in readable}
        lost_from_log = [v for v, po in self.acked.items() if (*po, v) not in readable_set]
        lost_from_lake = [t for t in readable_set if lake_values[t[2]] == 0]
        dup_log = sum(n - 1 for n in log_values.values() if n > 1)
        dup_lake = sum(n - 1 for n in lake_values.values() if n > 1)
        dup_offsets = sum(n - 1 for n in lake_offsets.values() if n > 1)
        lat = sorted(self.latencies)
        q = statistics.quantiles(lat, n=100) if len(lat) >= 100 else [float("nan")] * 99
        return {
            "bench": "soak",
            "minutes": self.args.minutes,
            "soak_seconds": round(secs, 1),
            "acknowledged": len(self.acked),
            "delivery_failures": self.failed,
            "readable": len(readable),
            "ingested": len(lake),
            "lost_acknowledged": len(lost_from_log),
            "lost_in_lake": len(lost_from_lake),
            "duplicated_in_log": dup_log,
            "duplicated_in_lake": dup_lake,
            "duplicated_offsets_in_lake": dup_offsets,
            "consumed_during_soak": self.consumed,
            "broker_kills": self.kills,
            "broker_clean_stop_exit": stop_code,
            "ingest_runs": self.ingest_runs + 1,
            "ingest_runs_killed": self.ingest_killed,
            "ingest_failures": self.ingest_failures,
            "final_ingest_exit": final_ingest,
            "hostile_connections": self.hostile_opened,
            "peak_broker_rss_mib": round(self.peak_rss_kib / 1024, 1),
            "produce_p50_ms": round(q[49] * 1000, 2),
            "produce_p99_ms": round(q[98] * 1000, 2),
            "load_avg_1m_end": os.getloadavg()[0],
        }


def _alive(s: socket.socket) -> bool:
    try:
        data = s.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        s.close()
        return False
    if data == b"":
        s.close()
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=2.0)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--rate", type=int, default=3000, help="records/s over all producers")
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--hostile", type=int, default=100, help="hostile connections at once")
    ap.add_argument("--kill-every", type=float, default=30.0, help="seconds between SIGKILLs")
    ap.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    args = ap.parse_args()
    work = Path(args.keep or tempfile.mkdtemp(prefix="soak-"))
    soak = Soak(args, work)
    try:
        result = soak.run()
    finally:
        soak.stop.set()
        soak.broker.close()
    print(json.dumps(result))
    bad = (
        result["lost_acknowledged"]
        + result["lost_in_lake"]
        + result["duplicated_in_log"]
        + result["duplicated_in_lake"]
        + result["duplicated_offsets_in_lake"]
        + len(result["ingest_failures"])
        + (result["final_ingest_exit"] != 0)
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
