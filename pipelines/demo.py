"""``make demo``: the whole lakehouse in one command, on the embedded default, on this machine.

Stages (each timed in the output; each stage's log under ``var/demo/``):

1. ``broker``: the included broker (``loglake broker``) on a free port of 127.0.0.1, log dir
   ``var/demo/kafka-logs``; high watermarks and log start offsets checkpointed every second.
2. ``produce``: real producers (confluent-kafka / librdkafka), topics created through the
   Admin API: ``orders`` (lz4) and ``customers`` (zstd) with keys and headers; ``profiles``,
   compacted (``cleanup.policy=compact``), with several updates of the same keys and
   tombstones; ``clicks`` (gzip) with 16 KiB segments, so that a partition has several.
3. ``airflow db migrate``: of ``var/demo/airflow`` (the Airflow environment,
   ``airflow/.venv``), started in the background before stage 1; this stage waits for it.
   The DAG runs get Variables pointing at the demo's pipeline TOML, log dir, lake and broker.
4. ``ingest DAG``: ``airflow dags test loglake_ingest``: ingest -> lookups -> compact ->
   quality, one ``spark-submit`` each on ``local[2]``.
5. ``maintenance DAG``: ``airflow dags test loglake_maintenance``: retention (online, through
   DeleteRecords on the running broker: ``clicks`` holds more than its ``retention.bytes``, so
   its oldest segments go, all of them already in the lake) -> maintain (delta-rs) -> quality
   (which accepts the lake's rows below the new log start: retention removed them after ingest).
6. ``sql``: a few answers with ``loglake sql`` (records per topic, the compacted table, a
   time_lookup question with real timestamps, what retention removed and the new log start the
   broker reports, the quality results) and the Data Docs path.
7. ``re-run``: ``loglake_ingest`` once more (ingest, lookups, compact; its quality task marked
   successful without running, ``--mark-success-pattern``): every table's version and row
   count is compared before and after, and must not change.
8. ``stop``: SIGTERM to the broker; it must exit 0.

The broker keeps running through the DAGs, as in production: the jobs read its log dirs
while it serves (ingest stops at the checkpointed high watermark), and retention must delete
through it (Kafka's DeleteRecords, Airflow connection ``loglake_broker``) because a running
broker holds the log dirs' ``.lock``, which offline retention would need.

``--secure``: the broker's only listener is ``SASL_PLAINTEXT`` (PLAIN for an ``admin`` user of
its JAAS config, SCRAM-SHA-512), the demo user is made with ``loglake users`` (as ``admin``),
and every client authenticates as that user with one ``client.properties``
(``var/demo/client.properties``, Kafka's client properties, random passwords): the producers,
the admin client and the watermark consumer (:func:`logstore.tools.client_config.
librdkafka_config`), and the jobs through ``[kafka] command_config`` of the demo's pipeline
TOML (ingest's lake-group commit, retention's DeleteRecords). Without TLS: the demo makes no
certificates.

``--s3``: the lake is on a local S3 server instead of ``var/demo/lake``
(:mod:`pipelines.demo_s3`: moto's server mode in a child process on a free port of 127.0.0.1,
objects in memory, so the lake is gone when the demo ends), ``s3://loglake-demo/lake``. The
demo's pipeline TOML says so with ``[paths] lake`` and a ``[storage]`` section (endpoint, keys,
region), the only place the jobs learn where the store is (the DAG runs get no ``AWS_*``
variable); the demo's own reads use the same settings and its queries run as ``loglake sql
--config <that file>``. The ``sql`` stage ends with where the lake is and what it holds.

Each run starts from an empty ``var/demo``. Exit codes: 0 done; 1 a stage failed (the stage
and the paths of its logs are printed); 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, open_store, use_job_settings
from logstore.tools.client_config import librdkafka_config, load_client_config
from pipelines.demo_s3 import LocalS3, lake_tables, wait_listening

__all__ = ["Demo", "DemoError", "main"]

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
AIRFLOW_BIN = ROOT / "airflow" / ".venv" / "bin" / "airflow"

# topic -> (partitions, producer codec, topic configs)
TOPICS: dict[str, tuple[int, str, dict[str, str]]] = {
    "orders": (3, "lz4", {}),
    "customers": (2, "zstd", {}),
    "profiles": (2, "lz4", {"cleanup.policy": "compact"}),
    # retention.bytes: the maintenance DAG's retention deletes the oldest (ingested) segments
    "clicks": (1, "gzip", {"segment.bytes": "16384", "retention.bytes": "65536"}),
}
PROFILE_KEYS = 200  # keys of the compacted topic, each updated UPDATES times
UPDATES = 5
TOMBSTONES = 20  # profile-0 .. profile-19 are deleted at the end


class DemoError(Exception):
    """A stage failed; the message says why and which logs to read."""


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


@dataclass
class Demo:
    """One demo run's places and what it measured."""

    work: Path
    records: int = 20_000
    port: int = 0
    broker: subprocess.Popen[bytes] | None = None
    timings: list[tuple[str, float]] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)
    midpoint_ms: int = 0  # a timestamp between the two halves of the orders topic
    secure: bool = False  # SASL_PLAINTEXT only, every client logs in (module docstring)
    s3: LocalS3 | None = None  # the lake on a local S3 server (module docstring)

    @property
    def log_dir(self) -> Path:
        return self.work / "kafka-logs"

    @property
    def lake(self) -> Path:
        """The local lake (without ``--s3``)."""
        return self.work / "lake"

    @property
    def lake_uri(self) -> str:
        """Where the lake is: ``s3://loglake-demo/lake`` with ``--s3``, else :attr:`lake`."""
        return self.s3.lake if self.s3 else str(self.lake)

    def table(self, rel: str) -> str:
        """The location of the lake's table ``rel`` (``records``, ``topics/profiles``)."""
        return LakeLocation.parse(self.lake_uri).join(rel).uri

    @property
    def airflow_home(self) -> Path:
        return self.work / "airflow"

    @property
    def config(self) -> Path:
        return self.work / "pipeline.toml"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client_properties(self) -> Path:
        return self.work / "client.properties"

    def client_conf(self) -> dict[str, Any]:
        """confluent-kafka settings of the demo's clients: the bootstrap server, and with
        ``secure`` the login of ``client.properties``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if self.secure:
            conf |= librdkafka_config(load_client_config(self.client_properties))
        return conf

    # ------------------------------------------------------------------ stages

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage; an unexpected exception becomes a :class:`DemoError` naming it."""
        _say(f"== {name}")
        started = time.monotonic()
        try:
            yield
        except DemoError:
            raise
        except Exception as exc:
            raise DemoError(f"{name}: {type(exc).__name__}: {exc}") from exc
        finally:
            seconds = time.monotonic() - started
            self.timings.append((name, seconds))
        _say(f"   {name}: {seconds:.1f} s")

    def start_s3(self) -> None:
        """The local S3 server and its bucket (:mod:`pipelines.demo_s3`); this process's lake
        calls then use the ``[storage]`` settings the demo writes for the jobs."""
        if self.s3 is None:
            return
        log_file = self.work / "s3.log"
        try:
            self.s3.start(_free_port(), log_file)
        except LoglakeError as exc:
            raise DemoError(str(exc)) from None
        use_job_settings(self.s3.settings())
        _say(f"   S3 server (moto) on {self.s3.endpoint}, lake {self.lake_uri}, log: {log_file}")

    def stop_s3(self) -> None:
        if self.s3 is not None:
            use_job_settings(None)
            self.s3.stop()

    def start_broker(self) -> None:
        self.log_dir.mkdir(parents=True)
        self.port = _free_port()
        log_file = self.work / "broker.log"
        protocol = "SASL_PLAINTEXT" if self.secure else "PLAINTEXT"
        admin_password = secrets.token_urlsafe(16)
        overrides = {
            "listeners": f"{protocol}://127.0.0.1:{self.port}",
            "advertised.listeners": f"{protocol}://127.0.0.1:{self.port}",
            "log.dirs": str(self.log_dir),
            # Checkpoints every second, so the jobs see what was produced without waiting 5 s
            # (high watermarks) or 60 s (log start offsets, after retention).
            "replica.high.watermark.checkpoint.interval.ms": "1000",
            "log.flush.start.offset.checkpoint.interval.ms": "1000",
            # The retention job deletes (lake-aware, through DeleteRecords), not the broker's own
            # periodic retention (Kafka's rules alone: it would delete clicks' segments whether
            # or not the lake holds them, 5 minutes after the start). log.retention.lake.group
            # would bound it by the lake's group, but from its first ingest on only, and it
            # would then take clicks' ingested segments before the retention job the demo shows.
            "log.retention.check.interval.ms": "86400000",
        }
        if self.secure:
            overrides |= {
                "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
                    "org.apache.kafka.common.security.plain.PlainLoginModule required"
                    f' user_admin="{admin_password}";'
                ),
            }
        cmd = [
            str(VENV_BIN / "loglake"),
            "broker",
            "--config",
            str(ROOT / "conf" / "broker.properties"),
        ]
        for key, value in overrides.items():
            cmd += ["--override", f"{key}={value}"]
        with log_file.open("wb") as out:
            self.broker = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_listening(self.broker, self.port, "the broker", log_file)
        except LoglakeError as exc:
            raise DemoError(str(exc)) from None
        _say(f"   broker on {self.bootstrap}, log.dirs={self.log_dir}, log: {log_file}")
        if self.secure:
            self._make_user(admin_password)

    def _make_user(self, admin_password: str) -> None:
        """``loglake users`` (logged in as the JAAS config's admin) gives the demo user a
        SCRAM-SHA-512 credential; ``client.properties`` holds that user's login."""
        password = secrets.token_urlsafe(16)
        admin = self.work / "admin.properties"
        login = "security.protocol=SASL_PLAINTEXT\nsasl.mechanism={}\nsasl.jaas.config={}\n"
        module = 'org.apache.kafka.common.security.{} required username="{}" password="{}";'
        admin.write_text(
            login.format("PLAIN", module.format("plain.PlainLoginModule", "admin", admin_password))
        )
        log = self.work / "users.log"
        _run(
            [str(VENV_BIN / "loglake"), "users", "--bootstrap-server", self.bootstrap,
             "--command-config", str(admin), "--alter", "--entity-name", "demo",
             "--add-config", f"SCRAM-SHA-512=[iterations=8192,password={password}]"],
            dict(os.environ), log, "loglake users",
        )  # fmt: skip
        self.client_properties.write_text(
            login.format("SCRAM-SHA-512", module.format("scram.ScramLoginModule", "demo", password))
        )
        _say(f"   SASL_PLAINTEXT only; user demo (SCRAM-SHA-512): {self.client_properties}")

    def stop_broker(self) -> None:
        if self.broker is None or self.broker.poll() is not None:
            return
        self.broker.send_signal(signal.SIGTERM)
        try:
            code = self.broker.wait(60)
        except subprocess.TimeoutExpired:
            self.broker.kill()
            self.broker.wait()
            raise DemoError(
                f"the broker did not stop within 60 s; see {self.work / 'broker.log'}"
            ) from None
        if code != 0:
            raise DemoError(f"the broker exited with {code}; see {self.work / 'broker.log'}")

    def produce(self) -> None:
        from confluent_kafka import Producer  # noqa: PLC0415
        from confluent_kafka.admin import AdminClient, NewTopic  # noqa: PLC0415

        admin = AdminClient(self.client_conf())
        futures = admin.create_topics(
            [NewTopic(name, num_partitions=parts, replication_factor=1, config=conf)
             for name, (parts, _, conf) in TOPICS.items()]
        )  # fmt: skip
        for future in futures.values():
            future.result(timeout=30)
        for topic, (_, codec, _) in TOPICS.items():
            producer = Producer(
                {
                    **self.client_conf(),
                    "compression.type": codec,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 20,
                }
            )
            sent = getattr(self, f"_produce_{topic}")(producer, topic)
            if remaining := producer.flush(60):
                raise DemoError(f"{remaining} records to {topic} were not acknowledged")
            self.sent[topic] = sent
            kind = ", compacted" if topic == "profiles" else ""
            _say(f"   {topic}: {sent} records ({codec}{kind})")

    def _produce_orders(self, producer: Any, topic: str) -> int:
        half = self.records // 2
        for i in range(self.records):
            if i == half:
                # Two halves a second apart: the time_lookup question asks for the first offset
                # of each partition at or after this moment.
                producer.flush(60)
                time.sleep(1.0)
                self.midpoint_ms = int(time.time() * 1000)
            value = json.dumps({"order": i, "amount": i * 7 % 1000}).encode()
            producer.produce(topic, key=f"customer-{i % 500}".encode(), value=value,
                             headers=[("source", b"demo"), ("seq", str(i).encode())])  # fmt: skip
            if i % 5_000 == 0:
                producer.poll(0)
        return self.records

    def _produce_customers(self, producer: Any, topic: str) -> int:
        n = self.records // 2
        for i in range(n):
            value = json.dumps({"customer": i % 500, "visit": i}).encode()
            producer.produce(topic, key=f"customer-{i % 500}".encode(), value=value,
                             headers=[("source", b"demo")])  # fmt: skip
        return n

    def _produce_profiles(self, producer: Any, topic: str) -> int:
        n = 0
        for version in range(UPDATES):
            for k in range(PROFILE_KEYS):
                value = json.dumps({"profile": k, "version": version}).encode()
                producer.produce(topic, key=f"profile-{k}".encode(), value=value,
                                 headers=[("version", version.to_bytes(4, "big"))])  # fmt: skip
                n += 1
            producer.flush(60)  # one batch per round: updates land in later batches
        for k in range(TOMBSTONES):
            producer.produce(topic, key=f"profile-{k}".encode(), value=None)
            n += 1
        return n

    def _produce_clicks(self, producer: Any, topic: str) -> int:
        # Random hex that gzip shrinks to about half: several segments of 16 KiB, more than
        # the topic's retention.bytes keeps.
        n = 1600
        for i in range(n):
            value = f"click {i} ".encode() + os.urandom(48).hex().encode()
            producer.produce(topic, key=f"session-{i % 97}".encode(), value=value)
            if i % 100 == 99:
                producer.flush(60)  # small batches, so that segments roll at 16 KiB
        return n

    def wait_for_checkpoints(self) -> None:
        """Until the broker's high-watermark checkpoint covers every record produced."""
        from logstore.storage.checkpoints import read_offset_checkpoint  # noqa: PLC0415

        path = self.log_dir / "replication-offset-checkpoint"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if path.is_file():
                hws = read_offset_checkpoint(path)
                per_topic: dict[str, int] = {}
                for (topic, _), hw in hws.items():
                    per_topic[topic] = per_topic.get(topic, 0) + hw
                if all(per_topic.get(t, 0) >= n for t, n in self.sent.items()):
                    return
            time.sleep(0.2)
        raise DemoError(f"the broker did not checkpoint its high watermarks; see {path}")

    def write_config(self) -> None:
        self.config.write_text(
            "# Written by `make demo`: the demo's pipeline configuration.\n"
            f"[paths]\nlog_dirs = [{json.dumps(str(self.log_dir))}]\n"
            f"lake = {json.dumps(self.lake_uri)}\n"
            '[spark]\napp_name = "loglake"\nmaster = "local[2]"\n'
            '[spark.conf]\n"spark.sql.shuffle.partitions" = "4"\n'
            '"spark.ui.enabled" = "false"\n'
            f"[retention]\nbroker_config = {json.dumps(str(ROOT / 'conf' / 'broker.properties'))}\n"
            "[quality]\nmax_quarantined_batches = 0\n"
            + (
                f"[kafka]\ncommand_config = {json.dumps(str(self.client_properties))}\n"
                if self.secure
                else ""
            )
            + (
                "[storage]\n"
                + "".join(f"{k} = {json.dumps(v)}\n" for k, v in self.s3.storage_section().items())
                if self.s3
                else ""
            ),
            encoding="utf-8",
        )

    def airflow_env(self) -> dict[str, str]:
        # With --s3 the jobs learn where the store is from [storage] alone: no AWS_* variable
        # of this shell reaches them (a real AWS session here would otherwise mix in).
        dropped = ("AIRFLOW", "PYSPARK", "VIRTUAL_ENV", "PYTHONPATH") + (
            ("AWS_",) if self.s3 else ()
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith(dropped)}
        variables = {
            "loglake_root": str(ROOT),
            "loglake_config": str(self.config),
            "loglake_python": sys.executable,
        }
        host, _, port = self.bootstrap.rpartition(":")
        env.update(
            AIRFLOW_HOME=str(self.airflow_home),
            AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "airflow" / "dags"),
            AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False",
            # a transient failure is retried after seconds, not Airflow's default 5 minutes
            AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY="5",
            AIRFLOW_CONN_LOGLAKE_SPARK=json.dumps({"conn_type": "spark", "host": "local[2]"}),
            AIRFLOW_CONN_LOGLAKE_BROKER=json.dumps(
                {"conn_type": "generic", "host": host, "port": int(port)}
            ),
        )
        env.update({f"AIRFLOW_VAR_{k.upper()}": v for k, v in variables.items()})
        return env

    def start_migrate(self) -> subprocess.Popen[bytes]:
        """``airflow db migrate`` of the demo's AIRFLOW_HOME, started in the background."""
        if not AIRFLOW_BIN.is_file():
            raise DemoError(
                f"the Airflow environment is missing ({AIRFLOW_BIN}): run tools/bootstrap.sh"
            )
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        with (self.work / "airflow-db.log").open("wb") as out:
            return subprocess.Popen(
                [str(AIRFLOW_BIN), "db", "migrate"],
                env=self.airflow_env(),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def wait_migrate(self, proc: subprocess.Popen[bytes]) -> None:
        try:
            code = proc.wait(600)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        if code != 0:
            log = self.work / "airflow-db.log"
            raise DemoError(f"airflow db migrate failed with exit code {code}; see {log}")

    def dags_test(
        self, dag_id: str, date: str, log_name: str, *, skip: str | None = None
    ) -> dict[str, tuple[str, float]]:
        """``airflow dags test``; ``{task: (state, seconds)}`` from Airflow's database.
        ``skip``: a regex of task ids marked successful without running."""
        log = self.work / log_name
        cmd = [str(AIRFLOW_BIN), "dags", "test", dag_id, date]
        if skip:
            cmd += ["--mark-success-pattern", skip]
        code = _run(cmd, self.airflow_env(), log, f"airflow dags test {dag_id}", check=False)
        tasks = self.task_states(dag_id, date)
        for task, (state, seconds) in tasks.items():
            _say(f"   {dag_id}.{task}: {state} in {seconds:.1f} s")
        if code != 0 or {s for s, _ in tasks.values()} != {"success"}:
            raise DemoError(
                f"airflow dags test {dag_id} failed (exit {code}); see {log} and the task logs "
                f"under {self.airflow_home / 'logs'}"
            )
        return tasks

    def task_states(self, dag_id: str, date: str) -> dict[str, tuple[str, float]]:
        with contextlib.closing(sqlite3.connect(self.airflow_home / "airflow.db")) as db:
            rows = db.execute(
                "SELECT ti.task_id, ti.state, ti.start_date, ti.end_date FROM task_instance ti "
                "JOIN dag_run r ON ti.dag_id = r.dag_id AND ti.run_id = r.run_id "
                "WHERE ti.dag_id = ? AND date(r.logical_date) = ? ORDER BY ti.start_date",
                (dag_id, date),
            ).fetchall()
        return {task: (state or "none", _seconds(start, end)) for task, state, start, end in rows}

    def sql(self, query: str, *, fmt: str = "table") -> None:
        """Print a query and its answer, exactly as ``loglake sql`` prints them."""
        from logstore.cli import main as loglake  # noqa: PLC0415

        shown = " ".join(query.split())
        # --s3: the lake and the store's settings come from the pipeline TOML, as for the jobs
        where = ["--config", str(self.config)] if self.s3 else ["--lake", str(self.lake)]
        _say(f'$ loglake sql {where[0]} {_rel(Path(where[1]))} "{shown}"')
        argv = ["sql", *where, "--format", fmt, query]
        sys.stdout.flush()
        if loglake(argv) != 0:
            raise DemoError(f"loglake sql failed: {shown}")
        sys.stdout.flush()

    def watermarks(self, topic: str) -> tuple[int, int]:
        """(log start, high watermark) of ``topic`` partition 0, from the broker."""
        from confluent_kafka import Consumer, TopicPartition  # noqa: PLC0415

        consumer = Consumer({**self.client_conf(), "group.id": "loglake-demo"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        finally:
            consumer.close()
        return int(low), int(high)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """``{table: (version, rows)}`` of every table under the lake (delta-rs)."""
        from pipelines.catalog import find_tables, open_table  # noqa: PLC0415

        out: dict[str, tuple[int, int]] = {}
        for table in find_tables(self.lake_uri):
            dt = open_table(table)
            rows = sum(a.get("num_records") or 0 for a in _adds(dt))
            out[table.name] = (dt.version(), rows)
        return out


def read_table(path: Path | str, columns: list[str] | None = None) -> Any:
    """A Delta table as one Arrow table through delta-rs's DataFusion engine, which honours
    deletion vectors (compacted topic tables carry them; ``to_pyarrow_table`` refuses those);
    ``path`` may be on an object store (this process's storage settings)."""
    import pyarrow as pa  # noqa: PLC0415
    from deltalake import DeltaTable, QueryBuilder  # noqa: PLC0415

    from logstore.objectstore import delta_target  # noqa: PLC0415

    cols = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    uri, options = delta_target(path)
    qb = QueryBuilder().register("t", DeltaTable(uri, storage_options=options or None))
    return pa.table(qb.execute(f"SELECT {cols} FROM t").read_all())


def _adds(dt: Any) -> list[dict[str, Any]]:
    """The add actions' record counts (from the log's file statistics, no data read)."""
    actions = dt.get_add_actions(flatten=True)
    import pyarrow as pa  # noqa: PLC0415

    table = pa.table(actions)
    return [{"num_records": n} for n in table.column("num_records").to_pylist()]


def _seconds(start: str | None, end: str | None) -> float:
    from datetime import datetime  # noqa: PLC0415

    if not start or not end:
        return 0.0
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _rel(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _run(cmd: list[str], env: dict[str, str], log: Path, what: str, *, check: bool = True) -> int:
    with log.open("ab") as out:
        code = subprocess.run(
            cmd, env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    if check and code != 0:
        raise DemoError(f"{what} failed with exit code {code}; see {log}")
    return code


def _orders_midpoint_sql(midpoint_ms: int) -> tuple[str, str]:
    from datetime import UTC, datetime  # noqa: PLC0415

    iso = datetime.fromtimestamp(midpoint_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lookup = (
        "SELECT partition, min(first_offset) AS first_offset FROM time_lookup "
        f"WHERE topic = 'orders' AND max_timestamp >= TIMESTAMP '{iso}' "
        "GROUP BY partition ORDER BY partition"
    )
    check = (
        'SELECT partition, min("offset") AS first_offset FROM records '
        f"WHERE topic = 'orders' AND timestamp >= TIMESTAMP '{iso}' "
        "GROUP BY partition ORDER BY partition"
    )
    return lookup, check


def run_demo(demo: Demo) -> None:
    """The stages of the module docstring; raises :class:`DemoError` naming the failed one."""
    # Airflow's database is set up while the broker starts and the producers run.
    migrate = demo.start_migrate()
    try:
        if demo.s3:
            with demo.stage("s3 server"):
                demo.start_s3()
        with demo.stage("broker"):
            demo.start_broker()
        with demo.stage("produce"):
            demo.produce()
            demo.wait_for_checkpoints()
        with demo.stage("airflow db migrate"):
            demo.write_config()
            demo.wait_migrate(migrate)
            _say(f"   AIRFLOW_HOME={demo.airflow_home}, pipeline config {demo.config}")
        with demo.stage("ingest DAG"):
            demo.dags_test("loglake_ingest", "2024-01-01", "dag-ingest.log")
        with demo.stage("maintenance DAG"):
            demo.dags_test("loglake_maintenance", "2024-01-01", "dag-maintenance.log")
        with demo.stage("sql"):
            show_answers(demo)
        with demo.stage("re-run ingest DAG"):
            before = demo.snapshot()
            demo.dags_test("loglake_ingest", "2024-01-02", "dag-ingest-rerun.log", skip="quality")
            after = demo.snapshot()
            compare_snapshots(before, after)
        with demo.stage("stop broker"):
            demo.stop_broker()
    finally:
        if migrate.poll() is None:  # a stage before it failed
            migrate.kill()
            migrate.wait()
        with contextlib.suppress(DemoError):
            demo.stop_broker()
        demo.stop_s3()


def show_answers(demo: Demo) -> None:
    demo.sql(
        "SELECT topic, count(*) AS records, count(DISTINCT partition) AS partitions, "
        "sum(CASE WHEN value IS NULL THEN 1 ELSE 0 END) AS tombstones, min(codec) AS codec "
        "FROM records GROUP BY topic ORDER BY topic"
    )
    demo.sql(
        "SELECT (SELECT count(DISTINCT key) FROM records WHERE topic = 'profiles') "
        "AS keys_produced, (SELECT count(DISTINCT key) FROM records "
        "WHERE topic = 'profiles' AND value IS NULL) AS keys_tombstoned, "
        "(SELECT count(*) FROM topics_profiles) AS live_rows, "
        "(SELECT count(*) FROM topics_profiles t JOIN (SELECT DISTINCT key FROM records "
        "WHERE topic = 'profiles' AND value IS NULL) d ON t.key = d.key) AS tombstoned_but_live"
    )
    demo.sql('SELECT partition, key, value, "offset" FROM topics_profiles ORDER BY key LIMIT 3')
    lookup, check = _orders_midpoint_sql(demo.midpoint_ms)
    _say("   the first offset per orders partition after the midpoint, from the time index:")
    demo.sql(lookup)
    _say("   ... and the same from records:")
    demo.sql(check)
    _say("   what retention removed (the lake keeps those records: see records above):")
    demo.sql(
        'SELECT source, topic, "partition", count(*) AS segments, sum(bytes) AS bytes, '
        "min(segment_base_offset) AS from_offset, max(end_offset) AS new_log_start "
        'FROM retention_log GROUP BY source, topic, "partition" ORDER BY topic'
    )
    low, high = demo.watermarks("clicks")
    _say(f"   the broker (ListOffsets): clicks/0 log start {low}, high watermark {high}")
    demo.sql(
        "SELECT run_id, count(*) AS expectations, sum(CASE WHEN success THEN 1 ELSE 0 END) "
        "AS held FROM quality_results GROUP BY run_id ORDER BY run_id"
    )
    _say(f"   Data Docs: {demo.table('_quality/data_docs/index.html')}")
    verify(demo)
    show_lake(demo)


def show_lake(demo: Demo) -> None:
    """Where the lake is, and what it holds, from a listing of its store."""
    where = (
        f"on the local S3 server {demo.s3.endpoint} (moto, in memory: gone when the demo ends)"
        if demo.s3
        else "on local disk"
    )
    _say(f"   the lake: {demo.lake_uri}, {where}; its config: {demo.config} ([paths] lake"
         + (", [storage])" if demo.s3 else ")"))  # fmt: skip
    tables = lake_tables(demo.lake_uri)
    width = max(len(t.name) for t in tables)
    for t in tables:
        _say(f"     {t.name:<{width}}  version {t.version:<3} {t.objects:>4} objects "
             f"{t.size / 1024:>8.1f} KiB  Delta {t.protocol()}")  # fmt: skip


def verify(demo: Demo) -> None:
    """What the demo claims, read back with delta-rs: every record of every topic is in
    ``records``, the compacted table holds one row per live key, the quality runs held and
    their Data Docs need no network, retention removed ``clicks``' segments up to the log start
    the broker reports."""

    records = read_table(demo.table("records"), ["topic"])
    counts: dict[str, int] = {}
    for topic in records.column("topic").to_pylist():
        counts[topic] = counts.get(topic, 0) + 1
    if counts != demo.sent:
        raise DemoError(f"records holds {counts}, the producers sent {demo.sent}")
    profiles = read_table(demo.table("topics/profiles"))
    keys = sorted(k.decode() for k in profiles.column("key").to_pylist())
    expected = sorted(f"profile-{k}" for k in range(TOMBSTONES, PROFILE_KEYS))
    if keys != expected:
        raise DemoError(f"topics/profiles holds {len(keys)} keys, expected {len(expected)}")
    results = read_table(demo.table("quality_results"))
    if not all(results.column("success").to_pylist()):
        raise DemoError("a quality expectation failed; see quality_results")
    online = docs_needing_network(demo.table("_quality/data_docs"))
    if online:
        raise DemoError(f"Data Docs pages load from the network: {', '.join(online[:3])}")
    removed = read_table(demo.table("retention_log"), ["topic", "end_offset"]).to_pylist()
    ends = [r["end_offset"] for r in removed if r["topic"] == "clicks"]
    low, _ = demo.watermarks("clicks")
    if not ends or max(ends) != low:
        raise DemoError(f"retention removed {ends} of clicks, the broker's log start is {low}")


def docs_needing_network(site: Path | str) -> list[str]:
    """The Data Docs pages of ``site`` (a directory or an object-store prefix) that would still
    load a script or a stylesheet from a CDN (the quality job serves them from the site:
    pipelines.quality.docs_site)."""
    from pipelines.quality.docs_site import network_assets  # noqa: PLC0415

    store = open_store(LakeLocation.parse(site))
    pages = [o.path for o in store.list() if o.path.endswith(".html")]
    if not pages:
        return [f"{site}: no pages"]
    return [page for page in pages if network_assets(store.read(page).decode("utf-8"))]


def compare_snapshots(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> None:
    width = max(len(name) for name in after)
    _say(f"   {'table':<{width}}  version  rows  (before -> after the re-run)")
    changed = []
    for name in sorted(after):
        b, a = before.get(name), after[name]
        mark = "" if b == a else "  <- changed"
        _say(f"   {name:<{width}}  {b} -> {a}{mark}")
        if b != a:
            changed.append(name)
    if changed:
        raise DemoError(f"the re-run changed {', '.join(changed)}")
    _say("   the re-run changed no table")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="make demo",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="exit codes: 0 done; 1 a stage failed (its logs are named); 2 bad arguments",
    )
    parser.add_argument("--records", type=int, default=20_000, help="records of the orders topic")
    parser.add_argument("--dir", type=Path, default=ROOT / "var" / "demo", help="work directory")
    parser.add_argument(
        "--s3",
        action="store_true",
        help="the lake on a local S3 server (moto), s3://loglake-demo/lake, reached through the "
        "pipeline TOML's [storage]",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="the broker takes SASL_PLAINTEXT (SCRAM-SHA-512) only; every client logs in",
    )
    args = parser.parse_args(argv)
    if args.records < 4:
        parser.error("--records must be at least 4")
    demo = Demo(
        work=args.dir.resolve(),
        records=args.records,
        secure=args.secure,
        s3=LocalS3() if args.s3 else None,
    )
    shutil.rmtree(demo.work, ignore_errors=True)
    demo.work.mkdir(parents=True)
    started = time.monotonic()
    try:
        run_demo(demo)
    except DemoError as exc:
        _say(f"FAILED: {exc}")
        _say("logs: " + ", ".join(str(p) for p in sorted(demo.work.glob("*.log"))))
        return 1
    total = time.monotonic() - started
    _say("timings: " + ", ".join(f"{name} {s:.1f} s" for name, s in demo.timings))
    _say(f"done in {total:.1f} s; logs: {demo.work}/*.log")
    return 0


if __name__ == "__main__":
    sys.exit(main())
