"""kill -9 during log compaction, with the real processes:

- the **broker** (``python -m logstore.cli broker``) dies at each step of its swap
  (``LOGLAKE_FAILPOINT=cleaner.<step>``: SIGKILL at that point, no clean-up, as a kill -9);
  after a restart the log is exactly the old one (killed before the swap was committed) or
  exactly the cleaned one (after), no temporary file is left, confluent-kafka reads the
  reference model's records with their original offsets, every acknowledged record is there
  or superseded, and the broker goes on: a later produce and pass give the model again;
- the **job** (``spark-submit jobs/compact.py --log``, no broker: it swaps under the log dir's
  ``.lock``) dies at each step; the next run finishes or discards the killed pass and gives
  exactly the model's log, with no temporary file left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest

from logstore.failpoints import FAILPOINT_ENV
from logstore.protocol.batch import Codec
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.cleaner import read_cleaner_checkpoint
from logstore.storage.cleaner_manifest import MANIFEST_FILE, read_manifest
from logstore.storage.files import CLEANED_SUFFIX, DELETED_SUFFIX, SWAP_SUFFIX
from pipelines.compaction.log import clean_partition, hand_over, winners
from pipelines.compaction.model import Rec, Strategy
from pipelines.delta.staging import LEASE_TTL_ENV, STAGING_DIR
from tests.conftest import ROOT
from tests.fixtures.jobs import spark_submit, unreferenced_files
from tests.integration.broker.clients import ck_consume, new_topic
from tests.unit.storage.test_cleaner import expected_after, read_log, write_log

pytestmark = pytest.mark.integration

KILLED = -signal.SIGKILL  # what a failpoint leaves: the process SIGKILLed itself


def _leftovers(d: Path) -> list[str]:
    return sorted(
        n
        for n in os.listdir(d)
        if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX)) or n.startswith(MANIFEST_FILE)
    )


def _produce(bootstrap: str, topic: str, start: int, n: int) -> list[Rec]:
    """Idempotent confluent-kafka producer, acks=all, small batches; the acknowledged records
    (from the delivery reports) in offset order."""
    acked: list[Rec] = []

    def on_delivery(err: Any, msg: Any) -> None:
        assert err is None, err
        acked.append(Rec(0, msg.offset(), msg.timestamp()[1], msg.key(), msg.value()))

    p = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "lz4",
            "linger.ms": 2,
        }
    )
    for i in range(start, start + n):
        if i % 8 == 0:
            p.flush(30)
        value = None if i % 13 == 6 else b"value-%d" % i
        p.produce(
            topic, key=b"key-%d" % (i % 17), value=value, partition=0, on_delivery=on_delivery
        )
    assert p.flush(60) == 0
    return sorted(acked, key=lambda r: r.offset)


def _model(
    acked: list[Rec], end: int, cut: int | None = None
) -> list[tuple[int, bytes | None, bytes | None]]:
    """The log after a pass over ``[0, end)`` whose groups were swapped in up to ``cut``
    (default: all): below ``cut`` each key's winner over the pass's whole range (tombstones
    stay: first pass), the rest as produced."""
    cut = end if cut is None else cut
    keep = winners(r for r in acked if r.offset < end)
    return [(r.offset, r.key, r.value) for r in acked if r.offset >= cut or r.offset in keep]


def _alter(bootstrap: str, topic: str, name: str, value: str) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.incremental_alter_configs([res])[res].result(timeout=30)


def _consume(bootstrap: str, topic: str, n: int) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(g.offset, g.key, g.value) for g in ck_consume(bootstrap, topic, {0: n}, timeout=60)]


BROKER_STEPS = [
    "cleaner.before_swap",
    "cleaner.swapped",
    "cleaner.retired",
    "cleaner.live_partial",
    "cleaner.live",
    "cleaner.checkpointed",
]
# what is on disk when the broker dies there (evidence that it died mid-swap)
_STATE = {
    "cleaner.before_swap": lambda names: any(n.endswith(".log" + CLEANED_SUFFIX) for n in names),
    "cleaner.swapped": lambda names: any(n.endswith(".log" + SWAP_SUFFIX) for n in names),
    "cleaner.retired": lambda names: any(n.endswith(".log" + SWAP_SUFFIX) for n in names),
    "cleaner.live_partial": lambda names: (
        any(n.endswith(".index" + SWAP_SUFFIX) for n in names)
        and not any(n.endswith(".log" + SWAP_SUFFIX) for n in names)
    ),
    "cleaner.live": lambda names: (
        MANIFEST_FILE in names and not any(SWAP_SUFFIX in n for n in names)
    ),
    "cleaner.checkpointed": lambda names: MANIFEST_FILE in names,
}


@pytest.mark.parametrize("step", BROKER_STEPS)
def test_broker_killed_mid_swap(
    broker_factory: Any, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    monkeypatch.setenv(FAILPOINT_ENV, step)
    b = broker_factory()
    monkeypatch.delenv(FAILPOINT_ENV)  # the broker has it; this process (the job's side) must not
    topic = new_topic(
        b.bootstrap,
        partitions=1,
        prefix="kill",
        **{"cleanup.policy": "compact", "segment.bytes": "1024", "file.delete.delay.ms": "200"},
    )
    d = b.log_dir / f"{topic}-0"
    acked = _produce(b.bootstrap, topic, 0, 240)
    assert [r.offset for r in acked] == list(range(240))
    hw = 240
    # segments of ~1 KiB were rolled; groups of up to 4 KiB: several segments per group (the
    # first group keeps no record at all: its swap must still retire every segment it covers)
    _alter(b.bootstrap, topic, "segment.bytes", "4096")

    res = clean_partition(d, force=True, high_watermark=hw)
    assert res.groups >= 1 and res.records_out < res.records_in
    assert b.proc is not None
    assert b.proc.wait(timeout=60) == KILLED, b.log_tail()  # died at the failpoint
    names = os.listdir(d)
    assert _STATE[step](names), (step, sorted(names))
    manifest = read_manifest(d)
    assert manifest is not None and len(manifest.groups[0].replaced) > 1
    # Groups swap one at a time (as Kafka's): killed in the first group's swap, the first
    # group is committed from .swap on; killed at the end, all of them
    if step == "cleaner.checkpointed":
        assert read_cleaner_checkpoint(b.log_dir)[(topic, 0)] == res.end_offset
        cut = res.end_offset
    else:
        cut = 0 if step == "cleaner.before_swap" else manifest.groups[0].end_offset

    b.start()  # recovery on load finishes or discards the swap
    assert _leftovers(d) == []
    # each group exactly old (its swap not committed: .cleaned left) or new (committed)
    want_now = _model(acked, res.end_offset, cut)
    if step == "cleaner.before_swap":
        assert want_now == [(r.offset, r.key, r.value) for r in acked]
    else:
        assert len(want_now) < len(acked)
    assert _consume(b.bootstrap, topic, len(want_now)) == want_now

    # the broker goes on: more acknowledged records, another pass swapped by the broker
    more = _produce(b.bootstrap, topic, 240, 60)
    assert [r.offset for r in more] == list(range(240, 300))
    res2 = clean_partition(d, force=True, high_watermark=300)
    assert res2.groups >= 1
    assert hand_over(d) == (True, "applied or rejected by the broker (see the checkpoint)")
    assert read_cleaner_checkpoint(b.log_dir)[(topic, 0)] == res2.end_offset
    want = _model(acked + more, res2.end_offset)
    assert _consume(b.bootstrap, topic, len(want)) == want
    deadline = time.monotonic() + 30  # .deleted files go after file.delete.delay.ms
    while _leftovers(d) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _leftovers(d) == []


# -- the job, killed under spark-submit ------------------------------------------------------


def _spark_submit(args: list[str], step: str) -> subprocess.CompletedProcess[str]:
    return spark_submit("compact.py", args, failpoint=step, conf={"spark.task.maxFailures": "1"})


def _job_args(log_dir: Path) -> list[str]:
    conf = str(ROOT / "conf" / "pipeline.toml")
    return ["--config", conf, "--log-dirs", str(log_dir), "--lake", str(log_dir / "lake"), "--log"]


def _fields(records):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


# executor side (after the .cleaned files, before the manifest) and the driver's offline swap
JOB_STEPS = ["cleaner.rewritten", "cleaner.swapped", "cleaner.live_partial", "cleaner.checkpointed"]


@pytest.mark.parametrize("step", JOB_STEPS)
def test_job_killed_then_rerun_is_exact(tmp_path: Path, spark: Any, capsys: Any, step: str) -> None:
    from jobs.compact import main

    batches = [
        ([(i % 5, None if i % 9 == 4 else b"v%d" % i, None) for i in range(j, j + 4)], c, 7)
        for j, c in ((k, [Codec.GZIP, Codec.NONE, Codec.ZSTD][k % 3]) for k in range(0, 96, 4))
    ]
    d = write_log(tmp_path, batches, segment_bytes=300)
    before, headers = read_log(d)
    leo = headers[-1].next_offset
    write_offset_checkpoint(tmp_path / "replication-offset-checkpoint", {("t", 0): leo})
    killed = _spark_submit(_job_args(tmp_path), step)
    assert killed.returncode != 0, killed.stderr[-2000:]
    names = os.listdir(d)
    # it died mid-pass: something of the pass is on disk
    assert any(n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) or n == MANIFEST_FILE for n in names), (
        sorted(names),
        killed.stderr[-2000:],
    )

    # the re-run (no failpoint) finishes or discards the killed pass, then cleans
    assert main(_job_args(tmp_path)) == 0
    (res,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    after, _ = read_log(d)
    assert _fields(after) == expected_after(before, leo, Strategy(), expired=set())
    assert read_cleaner_checkpoint(tmp_path) == {("t", 0): leo}
    assert _leftovers(d) == []
    # nor anywhere else under the log dir (every partition, the lake the job was given)
    left = [
        str(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, DELETED_SUFFIX, ".tmp"))
        or p.name.startswith(MANIFEST_FILE)
        or "staging" in p.name
    ]
    assert left == []
    assert res["end_offset"] in (0, leo)  # 0: the killed pass was finished and nothing is due


# -- the table job, killed under spark-submit just before its commit ---------------------------


def test_table_job_killed_before_commit_then_rerun_is_exact(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from pipelines.compaction.table import run_compact, table_path, tombstones_path
    from tests.fixtures.compaction import append_records, read_topic_table, timestamp_rounds
    from tests.integration.compaction.test_compact_table import CONF, _config, _expected, _quiet

    rounds = timestamp_rounds(tmp_path)  # timestamp keeps a tombstone table: two to commit
    config = _config(tmp_path, rounds.strategy, buckets=rounds.buckets)
    append_records(tmp_path, "t", rounds.first, {0: 8})
    assert run_compact(spark, config, log=_quiet).topics[0].committed
    path = table_path(tmp_path, "t")
    tombs = tombstones_path(tmp_path, "t")
    before = (DeltaTable(path).version(), read_topic_table(path), DeltaTable(tombs).version())
    append_records(tmp_path, "t", rounds.second, {0: 11})
    killed = spark_submit(
        "compact.py",
        ["--config", str(rounds.conf)],
        failpoint="compact.before_commit",
        conf=CONF,
        env={**os.environ, LEASE_TTL_ENV: "3"},  # its leases expire within seconds
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # nothing committed, in either table
    assert (DeltaTable(path).version(), read_topic_table(path), DeltaTable(tombs).version()) == (
        before
    )
    (lease,) = (Path(path) / STAGING_DIR).glob("*.json")
    time.sleep(3 + 2 + 1.5)  # the killed run's leases expire (ttl + margin, whole seconds)
    result = run_compact(spark, config, log=_quiet).topics[0]
    assert result.committed
    assert read_topic_table(path) == _expected(rounds.first + rounds.second, rounds.strategy)
    assert not run_compact(spark, config, log=_quiet).topics[0].committed  # a no-op re-run
    # the killed run's files (scratch, data, change data, deletion vectors, leases) are gone:
    # each table directory holds exactly what some version of its log names, and the takeover
    # tombstone of the killed run's lease
    takeover = f"{STAGING_DIR}/{lease.name.removesuffix('.json')}.takeover"
    for table in (path, tombs):
        assert unreferenced_files(table) == [takeover]
