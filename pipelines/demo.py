"""``make demo``: the main job on the embedded default, end to end, on this machine.

1. Start the included broker (``loglake broker``) on a free port of 127.0.0.1 with its log
   directory under ``var/demo/kafka-logs``.
2. Produce sample records with a real Kafka client (confluent-kafka / librdkafka): two topics,
   lz4 and zstd, keys, headers and a tombstone.
3. Stop the broker with SIGTERM (clean shutdown: checkpoints, high watermarks).
4. Run the ingest job exactly as a data engineer would: ``spark-submit jobs/ingest.py`` on
   ``local[2]``, into the Delta tables under ``var/demo/lake``.
5. Query the ``records`` table with SQL through delta-rs (no Spark), then run the ingest job
   again to show that a re-run adds nothing.

Each run starts from an empty ``var/demo`` so the demo is repeatable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _start_broker(log_dir: Path, port: int, log_file: Path) -> subprocess.Popen[bytes]:
    cmd = [
        str(VENV_BIN / "loglake"),
        "broker",
        "--config",
        str(ROOT / "conf" / "broker.properties"),
        "--override",
        f"listeners=PLAINTEXT://127.0.0.1:{port}",
        "--override",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "--override",
        f"log.dirs={log_dir}",
    ]
    out = log_file.open("wb")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the broker exited with {proc.returncode}; see {log_file}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the broker did not listen on {port} within 60 s; see {log_file}")


def _produce(bootstrap: str, records_per_topic: int) -> dict[str, int]:
    from confluent_kafka import Producer  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = {"orders": "lz4", "customers": "zstd"}
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=2, replication_factor=1) for name in topics]
    )
    for future in futures.values():
        future.result(timeout=30)
    sent: dict[str, int] = {}
    for topic, codec in topics.items():
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "compression.type": codec,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 20,
            }
        )
        for i in range(records_per_topic):
            key = f"{topic[:-1]}-{i % 1000}".encode()
            value = json.dumps({"id": i, "topic": topic, "amount": i * 7 % 1000}).encode()
            producer.produce(topic, key=key, value=value, headers=[("source", b"demo")])
            if i % 10_000 == 0:
                producer.poll(0)
        # A tombstone: compacted readers see the key deleted.
        producer.produce(topic, key=f"{topic[:-1]}-0".encode(), value=None)
        remaining = producer.flush(60)
        if remaining:
            raise SystemExit(f"{remaining} records to {topic} were not acknowledged")
        sent[topic] = records_per_topic + 1
    return sent


def _spark_submit(args: list[str], env: dict[str, str], log_file: Path) -> dict[str, object]:
    import pyspark  # noqa: PLC0415

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    cmd = [
        str(spark_submit),
        *("--properties-file", str(ROOT / "conf" / "spark-defaults.conf")),
        *("--master", "local[2]"),
        str(ROOT / "jobs" / "ingest.py"),
        *args,
    ]
    with log_file.open("ab") as err:
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=err, check=False)
    if proc.returncode != 0:
        raise SystemExit(
            f"spark-submit jobs/ingest.py failed with exit code {proc.returncode}; see {log_file}"
        )
    lines = proc.stdout.decode().strip().splitlines()
    summary: dict[str, object] = json.loads(lines[-1])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000, help="records per topic")
    parser.add_argument("--dir", type=Path, default=ROOT / "var" / "demo", help="work directory")
    args = parser.parse_args(argv)

    work: Path = args.dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    log_dir, lake = work / "kafka-logs", work / "lake"
    log_dir.mkdir(parents=True)
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"

    _say(f"starting the broker on {bootstrap}, log.dirs={log_dir}")
    broker = _start_broker(log_dir, port, work / "broker.log")
    try:
        started = time.monotonic()
        sent = _produce(bootstrap, args.records)
        _say(f"produced {sent} in {time.monotonic() - started:.1f} s with confluent-kafka")
    finally:
        broker.send_signal(signal.SIGTERM)
        code = broker.wait(60)
    if code != 0:
        raise SystemExit(f"the broker exited with {code} on SIGTERM; see {work / 'broker.log'}")
    _say("broker stopped cleanly (checkpoints and high watermarks written)")

    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    job_args = ["--config", str(ROOT / "conf" / "pipeline.toml")]
    job_args += ["--log-dirs", str(log_dir), "--lake", str(lake)]
    _say(f"spark-submit jobs/ingest.py (local[2]); its log: {work / 'ingest.log'}")
    first = _spark_submit(job_args, env, work / "ingest.log")
    _say(f"ingest summary: {json.dumps(first)}")

    from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

    records = DeltaTable(str(lake / "records"))
    sql = (
        "SELECT topic, partition, count(*) AS records, min(offset) AS first_offset, "
        "max(offset) AS last_offset, sum(CASE WHEN value IS NULL THEN 1 ELSE 0 END) "
        "AS tombstones FROM records GROUP BY topic, partition ORDER BY topic, partition"
    )
    _say(f"SQL over the Delta table (delta-rs, version {records.version()}):\n  {sql}")
    import pyarrow as pa  # noqa: PLC0415

    # QueryBuilder answers in arro3; pyarrow takes it over the Arrow C stream interface.
    table = pa.table(QueryBuilder().register("records", records).execute(sql).read_all())
    print(table.to_pandas().to_string(index=False), flush=True)
    total = sum(table.column("records").to_pylist())
    if total != sum(sent.values()):
        raise SystemExit(f"the records table holds {total} rows, {sum(sent.values())} were sent")

    _say("running the ingest job again: exactly once, so nothing new is appended")
    second = _spark_submit(job_args, env, work / "ingest.log")
    _say(f"re-run summary: {json.dumps(second)}")
    after = DeltaTable(str(lake / "records"))
    rows = pa.table(
        QueryBuilder().register("records", after).execute("SELECT count(*) AS n FROM records")
    )
    n = rows.column("n")[0].as_py()
    if n != total:
        raise SystemExit(f"the re-run changed the row count from {total} to {n}")
    _say(f"done: {total} records in {lake / 'records'}, unchanged by the re-run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
