"""``jobs/compact.py --log`` decides which partitions are due, as Kafka's cleaner does, against
the real broker: confluent-kafka produces to two compacted topics, the job (real local[2]
session) runs five times with broker configs of its own (``--broker-config``):

1. ``log.cleaner.enable=false``: nothing cleaned, nothing read;
2. Kafka's defaults: the first pass (everything dirty, ratio 1.0) cleans both topics;
3. a little more data (dirty ratio below 0.5, fresh): both skipped and reported as not due,
   the segment files untouched;
4. ``log.cleaner.max.compaction.lag.ms`` = 10 min: only the topic whose records are an hour
   old is due (its first dirty batch is older than the lag), the other stays skipped;
5. ``log.cleaner.min.cleanable.ratio`` = 0.01: the other one's small dirty ratio is now enough.

The broker swaps each pass in; consumers then read each key's latest value."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from jobs.compact import main
from logstore.storage.cleaner import read_cleaner_checkpoint
from tests.integration.broker.clients import Rec, ck_consume, ck_produce, new_topic

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def _run(
    log_dir: Path, tmp_path: Path, capsys, name: str, props: str
) -> tuple[dict[str, dict], str]:
    """One job run with a broker config of ``props``: its results by topic, its stderr."""
    broker_config = tmp_path / f"{name}.properties"
    broker_config.write_text(props)
    args = [
        "--config", str(ROOT / "conf" / "pipeline.toml"), "--log-dirs", str(log_dir),
        "--lake", str(tmp_path / "lake"), "--log", "--timeout", "60",
        "--broker-config", str(broker_config),
    ]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr()
    results = json.loads(out.out.strip().splitlines()[-1])
    return {Path(r["dir"]).name.rsplit("-", 1)[0]: r for r in results}, out.err


def _segments(log_dir: Path, topic: str) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (log_dir / f"{topic}-0").glob("*.log")}


def test_due_by_dirty_ratio_and_by_lag_with_the_broker_config(
    broker_factory, spark, tmp_path: Path, capsys
) -> None:
    b = broker_factory(replica_high_watermark_checkpoint_interval_ms=200)
    configs = {"cleanup.policy": "compact", "segment.bytes": "2048", "file.delete.delay.ms": "1000"}
    fresh, old = (new_topic(b.bootstrap, partitions=1, prefix=p, **configs) for p in ("fr", "old"))
    now = int(time.time() * 1000)
    hour_ago = now - 3_600_000
    # 600 distinct keys, then every key again: the first pass keeps half of the records;
    # the fresh topic's stamped now, the other's an hour ago
    first = [Rec(0, b"k%03d" % (i % 600), b"first-%04d" % i, (), 0) for i in range(1200)]
    for topic, stamp in ((fresh, now), (old, hour_ago)):
        ck_produce(b.bootstrap, topic, [r._replace(timestamp=stamp) for r in first],
                   codec="none", acks="all", idempotent=False, flush_every=10)  # fmt: skip
    time.sleep(1.0)  # the high watermark checkpoint (every 200 ms)

    # 1. the cleaner disabled by the broker config: nothing at all
    runs, err = _run(b.log_dir, tmp_path, capsys, "off", "log.cleaner.enable=false\n")
    assert runs == {} and "log.cleaner.enable=false: nothing cleaned" in err
    assert read_cleaner_checkpoint(b.log_dir) == {}

    # 2. Kafka's defaults: never cleaned, everything dirty: ratio 1.0 >= 0.5
    runs, _ = _run(b.log_dir, tmp_path, capsys, "defaults", "")
    for topic in (fresh, old):
        assert runs[topic]["due"] and runs[topic]["reason"].startswith("dirty ratio 1.000 >= 0.5")
        assert runs[topic]["swapped"] is True, runs[topic]
        assert runs[topic]["records_out"] < runs[topic]["records_in"]
    cleaned_to = read_cleaner_checkpoint(b.log_dir)

    # a few more records, stamped as before
    more = [Rec(0, b"k%03d" % i, b"second-%04d" % i, (), 0) for i in range(120)]
    ck_produce(b.bootstrap, fresh, [r._replace(timestamp=now) for r in more], codec="none",
               acks="all", idempotent=False, flush_every=10)  # fmt: skip
    ck_produce(b.bootstrap, old, [r._replace(timestamp=hour_ago) for r in more], codec="none",
               acks="all", idempotent=False, flush_every=10)  # fmt: skip
    time.sleep(1.0)

    # 3. defaults again: a small dirty section, fresh: not due, reported, files untouched
    files = {topic: _segments(b.log_dir, topic) for topic in (fresh, old)}
    runs, err = _run(b.log_dir, tmp_path, capsys, "defaults2", "")
    for topic in (fresh, old):
        assert runs[topic]["due"] is False and runs[topic]["groups"] == 0, runs[topic]
        ratio = float(runs[topic]["reason"].split()[2])
        assert 0 < ratio < 0.5 and runs[topic]["reason"].endswith("< 0.5"), runs[topic]
        assert _segments(b.log_dir, topic) == files[topic]
    assert read_cleaner_checkpoint(b.log_dir) == cleaned_to
    assert err.count("skipped, not due (dirty ratio") == 2, err

    # 4. max.compaction.lag.ms: the hour-old dirty records are due whatever the ratio
    runs, _ = _run(b.log_dir, tmp_path, capsys, "lag", "log.cleaner.max.compaction.lag.ms=600000\n")
    assert runs[old]["due"] and runs[old]["reason"] == "max.compaction.lag.ms exceeded"
    assert runs[old]["swapped"] is True and runs[old]["end_offset"] > cleaned_to[(old, 0)]
    assert runs[fresh]["due"] is False and runs[fresh]["groups"] == 0
    assert read_cleaner_checkpoint(b.log_dir)[(fresh, 0)] == cleaned_to[(fresh, 0)]

    # 5. a lower min.cleanable.dirty.ratio makes the fresh topic's small ratio enough
    runs, _ = _run(b.log_dir, tmp_path, capsys, "ratio", "log.cleaner.min.cleanable.ratio=0.01\n")
    assert runs[fresh]["due"] and runs[fresh]["reason"].endswith(">= 0.01"), runs[fresh]
    assert runs[fresh]["swapped"] is True
    assert read_cleaner_checkpoint(b.log_dir)[(fresh, 0)] > cleaned_to[(fresh, 0)]

    # what consumers read: each key's latest value, below the cleaned end at least
    for topic in (fresh, old):
        end = read_cleaner_checkpoint(b.log_dir)[(topic, 0)]
        got = ck_consume(b.bootstrap, topic, {0: 10**6}, timeout=10)  # the whole log
        latest: dict[bytes, bytes | None] = {}
        for g in got:
            assert g.key not in latest or g.offset >= end, (topic, g)  # one per key below end
            latest[g.key] = g.value
        assert latest == {
            b"k%03d" % i: (b"second-%04d" % i if i < 120 else b"first-%04d" % (600 + i))
            for i in range(600)
        }
