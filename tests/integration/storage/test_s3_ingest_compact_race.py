"""Ingest racing compaction on one S3 lake (moto), as real concurrent ``spark-submit`` processes.

Records come from a real broker (confluent-kafka producing two rounds, the broker stopped and
restarted on the same log dir in between). After a first ingest and compaction, the second
round is ingested by ``jobs/ingest.py`` while ``jobs/compact.py`` compacts the same lake:
ingest commits to ``records`` while compaction reads it and commits ``topics/<topic>``, each
through put-if-absent. Whatever the interleaving, neither run loses or duplicates a commit:
``records`` holds every produced record once, in exactly one more commit; the topic table is
the reference model of the snapshot compaction read; after one more compaction (a serial
run's last step) it equals the model of everything produced, and re-runs of both jobs commit
nothing. Tables are read back with delta-rs (DataFusion), the bucket listed with boto3.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from logstore.objectstore import delta_target
from pipelines.compaction.config import CompactConfig
from pipelines.compaction.model import Rec, Strategy, compact
from pipelines.compaction.table import run_compact, table_path
from pipelines.ingest import load_config, run_ingest
from tests.conftest import ROOT
from tests.fixtures.jobs import spark_submit, unreferenced_files
from tests.fixtures.s3 import S3Bucket
from tests.integration.broker.clients import new_topic

pytestmark = pytest.mark.integration

STRATEGY = Strategy("offset")
KEYS = 40


def _quiet(_: str) -> None:
    pass


def _produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    """Records ``start .. start + n`` (key ``k<i % KEYS>``, every 7th a tombstone), partition
    ``i % 2``, acknowledged by all replicas."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(start, start + n):
        value = None if i % 7 == 3 else b"v%d" % i
        producer.produce(topic, key=b"k%d" % (i % KEYS), value=value, partition=i % 2)
    assert producer.flush(60) == 0


def _recs(n: int) -> list[Rec]:
    """What the broker holds after ``_produce`` of records ``0 .. n`` (offsets per partition)."""
    return [
        Rec(i % 2, i // 2, 0, b"k%d" % (i % KEYS), None if i % 7 == 3 else b"v%d" % i, ())
        for i in range(n)
    ]


def _delta(uri: str) -> DeltaTable:
    target, options = delta_target(uri)
    return DeltaTable(target, storage_options=options)


def _table(uri: str) -> pa.Table:
    dt = _delta(uri)
    return pa.table(QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())


def _records(lake: str) -> list[tuple[int, int, bytes, bytes | None]]:
    rows = _table(f"{lake}/records").to_pylist()
    return sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows)


def _topic_table(lake: str, topic: str) -> dict[tuple[int, bytes], tuple[int, bytes | None]]:
    out = {}
    for r in _table(table_path(lake, topic)).to_pylist():
        assert (r["partition"], r["key"]) not in out  # one row per live key
        out[(r["partition"], r["key"])] = (r["offset"], r["value"])
    return out


def _model(recs: list[Rec]) -> dict[tuple[int, bytes], tuple[int, bytes | None]]:
    return {pk: (r.offset, r.value) for pk, r in compact(recs, STRATEGY).items()}


def _summary(run: Any) -> dict[str, Any]:
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def test_ingest_racing_compaction_on_one_s3_lake_loses_and_duplicates_nothing(
    spark: SparkSession, broker_factory: Any, s3: S3Bucket, tmp_path: Path
) -> None:
    b = broker_factory()
    topic = new_topic(b.bootstrap, partitions=2, prefix="s3icr")
    _produce(b.bootstrap, topic, 0, 300)
    b.stop()
    lake = s3.uri("lake")
    conf_file = ROOT / "conf" / "pipeline.toml"
    ingest_config = load_config(conf_file, log_dirs=[str(b.log_dir)], lake=lake)
    compact_config = CompactConfig(
        log_dirs=(str(b.log_dir),), lake=lake, topics=(topic,), strategies={topic: STRATEGY},
        buckets=2,
    )  # fmt: skip
    # round 1, serially and in-process: the tables exist, the race below is incremental
    assert run_ingest(spark, ingest_config, log=_quiet).records == 300
    assert run_compact(spark, compact_config, log=_quiet).topics[0].committed
    assert _topic_table(lake, topic) == _model(_recs(300))
    records_version = _delta(f"{lake}/records").version()
    topic_version = _delta(table_path(lake, topic)).version()

    b.restart()
    _produce(b.bootstrap, topic, 300, 200)
    b.stop()
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        f'[paths]\nlog_dirs = ["{b.log_dir}"]\nlake = "{lake}"\n'
        f'[compact]\ntopics = ["{topic}"]\nbuckets = 2\n[compact.strategy]\n"{topic}" = "offset"\n',
        encoding="utf-8",
    )
    jobs = {
        "ingest": ["--config", str(conf_file),
                   "--log-dirs", str(b.log_dir), "--lake", lake],
        "compact": ["--config", str(conf)],
    }  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        done_runs = pool.map(lambda j: spark_submit(f"{j}.py", jobs[j]), jobs)
        runs = dict(zip(jobs, done_runs, strict=True))
    ingested, compacted = _summary(runs["ingest"]), _summary(runs["compact"])

    # ingest: every record once, the second round in exactly one more commit
    want = sorted((r.partition, r.offset, r.key, r.value) for r in _recs(500))
    assert ingested["records"] == 200 and ingested["committed"] is True
    assert _records(lake) == want
    assert _delta(f"{lake}/records").version() == records_version + 1
    # compaction read one snapshot of records: before the ingest commit or after it
    (done,) = compacted["topics"]
    read_all = bool(done["committed"])
    assert done["records_read"] == (200 if read_all else 0), compacted
    assert _topic_table(lake, topic) == _model(_recs(500 if read_all else 300)), compacted
    # a serial run's last step: compaction again, then both re-runs are no-ops
    again = run_compact(spark, compact_config, log=_quiet).topics[0]
    assert again.committed != read_all
    assert _topic_table(lake, topic) == _model(_recs(500))
    assert _delta(table_path(lake, topic)).version() == topic_version + 1  # one commit of it
    assert _records(lake) == want
    assert run_ingest(spark, ingest_config, log=_quiet).records == 0
    assert not run_compact(spark, compact_config, log=_quiet).topics[0].committed
    # no lease or uncommitted data file left in the bucket by either job: the tables,
    # mirrored from the bucket, hold only files some version of their log names
    for table in ("records", f"topics/{topic}"):
        copy = s3.mirror(f"lake/{table}/", tmp_path / table)
        assert unreferenced_files(copy) == [], table
