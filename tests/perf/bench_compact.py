"""Benchmark: key compaction to the Delta topic table (local[2]) vs baselines in this run.

Builds a ``records`` table as ingest leaves it (rows + ingest progress, written with delta-rs):
``--records`` records of ``--value-bytes`` random bytes over ``--keys`` distinct keys (uniform
random), ``--partitions`` partitions, timestamps increasing. Figures:

- ``full``: ``run_compact`` of a topic with no table yet: every record read, shuffled by
  bucket, merged, written and committed (records/s);
- (a) ``python_dict``: one process, the same records' keys and values as Python bytes, deduped
  with a dict (what one cleaner thread does); records/s of the loop alone and with the
  conversion from Arrow (``--baseline-records`` prefix);
- (b) ``spark_write``: a plain Spark Parquet write of the same row count (key and value columns
  of the same widths, generated in the JVM): rows/s;
- ``incremental``: ``--new-records`` new records (random keys of the table's key space) into a
  table of ``--keys`` keys, and into one of 10x ``--keys`` keys; the ratio of the two run times
  (target <= 2: cost grows with the change, not the table). Each case says how many buckets
  were rewritten and how many were merged with deletion vectors (the small table's buckets,
  mostly replaced, are rewritten; the large table's get deletion vectors). ``steps_seconds``
  gives each run's wall-clock steps and its stage-2 CPU seconds per phase (``stage2_cpu_*``,
  summed over the tasks): on a loaded machine compare those, not the wall-clock. ``cpu_s``:
  the CPU seconds of the whole run (the driver, Spark's JVM and its Python workers; with
  ``--lake s3`` the S3 server's apart, ``moto_cpu_s``), and ``cpu_ratio_large_to_small`` the
  ratio of those (server included). ``--repeat N`` runs the pair N times, each on a fresh copy
  of its input: the figures are the round of the median ratio, every round under ``rounds``.

Log section (``--only log`` runs it alone): the same record count, size and key space written
as segments of a compacted topic (``--partitions`` partitions, 8 MiB segments, uncompressed
batches of ``--log-batch`` records, keys uniform random; built with numpy from one batch
template, CRCs recomputed), then:

- ``log.full``: :func:`pipelines.compaction.log.run_log_compaction` (one Spark task per
  partition: plan, key map (a compiled walk of keys, offsets and null values), rewrite; each
  partition swapped in under the log dir's ``.lock`` by the driver as soon as its task is
  done), records/s end to end; ``task_steps_s``: the tasks' per-step wall and thread-CPU
  seconds and each partition's swap, summed over the partitions; ``why_records_out``: what
  stays and why (the whole log is cleanable here; with ``--log-partitioner random``, the
  default, every partition holds most keys, so ~3.67M of 10M records stay with 1M keys;
  ``key`` partitions by key as a keyed producer does: ~1M stay);
- (a) what one cleaner thread does, one process, on a ``--baseline-records`` prefix of
  partition 0 (rates are records/s of that prefix; a thread would take ``records / rate``
  for the whole log): ``log.python_dict``, the keys already in memory as Python bytes
  deduped with a dict (the loop alone, and with the conversion from numpy: no I/O, no
  decoding); ``log.python_decode_dict``, the segment files read and decoded by the
  project's pure-Python reference decoder (``validate_batch`` + kafka-python's
  ``DefaultRecordBatch``, the decoder benchmark's baseline) into a dict of key -> last
  offset; ``log.python_cleaner``, the storage layer's cleaner (``logstore.storage.cleaner``:
  plan, key map over its reference record decoder, ``rewrite_group``'s Python record loop,
  no swap) in one thread. ``log.ratios`` labels each ratio to ``full``. The broker has no
  cleaner thread of its own: compaction is this job.

Figures are wall-clock of one run each after a warm-up run that starts the Python workers.
Each measured step, the job's and the baselines' alike, starts with its input files in the
page cache (``--page-cache warm``, the default: read once right before; ``cold`` drops the
page cache instead, root only); ``page_cache`` in the output lists what was done before each
step and how long the warming read took. Last line: one JSON object.

``--lake s3`` measures the incremental figures (only those: the others are local-disk
baselines) with the lake on a local S3 server (moto's server mode, started here, as the tests'
``tests/fixtures/s3.py``): the tables, their inputs, the runs' scratch and deletion vector files
all in the bucket. With ``--cache`` the incremental cases' inputs are built on local disk (or
taken from the cache: the same inputs as the local figures) and put into the bucket file for
file before their measured run (``upload_s``); without it they are built on S3.
``moto_cpu_s``: the moto server process's CPU seconds during each measured run (on the same
cores as the job); ``moto_memory_kib``: its resident and peak memory after each run (objects
over ~5 MB are spooled to temporary files, so a 10M-key case peaks at ~1.7 GB). moto reads a
whole object for every ranged GET: the large table's bucket files (~65 MB each) cost it far
more per GET than the small table's (~6.5 MB), which a real S3 does not.

``--cache DIR`` keeps the generated inputs (the ``records`` tables, and the incremental cases'
tables before their measured run) under ``DIR`` and reuses them on the next run with the same
sizes: each run works on a hard-linked copy (data files are never modified; the Delta logs
are copied), so the 10M-record input is generated once.

    .venv/bin/python tests/perf/bench_compact.py [--records 10000000 --keys 1000000]
        [--cache /tmp/bench-compact-cache]
    .venv/bin/python tests/perf/bench_compact.py --only log
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from logstore.objectstore import LakeLocation  # noqa: E402
from logstore.objectstore.settings import delta_target  # noqa: E402
from pipelines.compaction.config import CompactConfig  # noqa: E402
from pipelines.compaction.table import run_compact, table_path  # noqa: E402
from pipelines.sources import RECORDS_ARROW_SCHEMA  # noqa: E402

CHUNK = 1_000_000


def _quiet(_: str) -> None:
    pass


def _fixed(values: np.ndarray, width: int) -> pa.Array:
    flat = np.ascontiguousarray(values).view(np.uint8).reshape(-1)
    fixed = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(width), len(values), [None, pa.py_buffer(flat)]
    )
    return fixed.cast(pa.binary())


def append_records(
    lake: Path | str,
    topic: str,
    n: int,
    *,
    key_space: int,
    value_bytes: int,
    partitions: int,
    next_offsets: list[int],
    rng: np.random.Generator,
    unique: bool = False,
) -> None:
    """Append ``n`` records (keys uniform over ``key_space``, or 0..n-1 when ``unique``)."""
    done = 0
    while done < n:
        m = min(CHUNK, n - done)
        ids = np.arange(done, done + m) if unique else rng.integers(0, key_space, m)
        keys = np.char.zfill(ids.astype("U12"), 12).astype("S12")
        part = (ids % partitions).astype(np.int32)
        offsets = np.empty(m, np.int64)
        for p in range(partitions):
            sel = part == p
            k = int(sel.sum())
            offsets[sel] = np.arange(next_offsets[p], next_offsets[p] + k)
            next_offsets[p] += k
        values = rng.integers(0, 256, (m, value_bytes), dtype=np.uint8)
        ts = 1_700_000_000_000_000 + offsets * 1000
        table = pa.table(
            {
                "topic": pa.array([topic] * m),
                "partition": pa.array(part),
                "offset": pa.array(offsets),
                "timestamp": pa.array(ts, pa.timestamp("us", "UTC")),
                "timestamp_type": pa.array(np.zeros(m, np.int32)),
                "key": _fixed(keys, 12),
                "value": _fixed(values, value_bytes),
                "headers": pa.array([[]] * m, RECORDS_ARROW_SCHEMA.field("headers").type),
                "producer_id": pa.array(np.full(m, -1, np.int64)),
                "producer_epoch": pa.array(np.full(m, -1, np.int16)),
                "base_sequence": pa.array(np.full(m, -1, np.int32)),
                "is_transactional": pa.array(np.zeros(m, bool)),
                "leader_epoch": pa.array(np.zeros(m, np.int32)),
                "segment_base_offset": pa.array(np.zeros(m, np.int64)),
                "batch_position": pa.array(np.zeros(m, np.int64)),
                "codec": pa.array(["none"] * m),
                "date": pa.array(np.full(m, 19675, np.int32), pa.int32()).cast(pa.date32()),
            },
            schema=RECORDS_ARROW_SCHEMA,
        )
        txns = [
            Transaction(f"loglake-ingest/{topic}/{p}", next_offsets[p]) for p in range(partitions)
        ]
        uri, options = delta_target(LakeLocation.parse(str(lake)).join("records"))
        write_deltalake(
            uri,
            table,
            storage_options=options or None,
            partition_by=["topic", "date"],
            mode="append",
            commit_properties=CommitProperties(app_transactions=txns),
        )
        done += m


def _cached(cache: Path | None, name: str, work: Path, build: Any) -> Path:
    """``work/name``: a copy of ``cache/name`` (built by ``build(path)`` if absent), or built
    in place without a cache. The copy hard-links the data files and copies the logs."""
    target = work / name
    if cache is None:
        build(target)
        return target
    source = cache / name
    if not (source / "done").exists():
        shutil.rmtree(source, ignore_errors=True)
        build(source)
        (source / "done").write_text("ok")
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(["cp", "-al", str(source), str(target)], check=True)
    for log in target.rglob("_delta_log"):
        shutil.rmtree(log)
        shutil.copytree(source / log.relative_to(target), log)
    return target


_PAGE_CACHE_MODES = ("warm", "cold", "as-is")
_page_cache_log: list[dict[str, Any]] = []


def page_cache(what: str, paths: list[Path], mode: str) -> None:
    """Set the page-cache state of a measured step's input files right before the step, the
    same for the job and its baselines (``--page-cache``; recorded in the output's
    ``page_cache``). This machine drops clean cached pages of files written tens of seconds
    earlier even with most memory free (1000 MB written, 815 MB still cached 45 s later), so
    without this a step's input is partly on disk by chance: a log written right before its
    baselines then read by the job 40 s later made the job 0.5-0.9 s slower than with the same
    files cached. ``warm``: every file read once (the seconds it took say how much was
    cached); ``cold``: ``sync`` + drop the whole page cache (root only); ``as-is``: nothing."""
    if mode == "as-is":
        return
    if mode == "cold":
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
        except OSError as exc:
            raise SystemExit(f"--page-cache cold needs root (drop_caches): {exc}") from None
        _page_cache_log.append({"before": what, "mode": mode})
        return
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")))]
    buf = bytearray(8 << 20)
    n = 0
    t0 = time.perf_counter()
    for f in files:
        if f.is_file():
            with f.open("rb", buffering=0) as fh:
                while got := fh.readinto(buf):
                    n += got
    _page_cache_log.append(
        {"before": what, "mode": mode, "mib": n >> 20, "read_s": time.perf_counter() - t0}
    )


def _config(lake: Path | str, topic: str, buckets: int) -> CompactConfig:
    local = LakeLocation.parse(str(lake)).is_local
    logs = Path(lake) / "logs" if local else Path(tempfile.gettempdir()) / "bench-compact-logs"
    logs.mkdir(exist_ok=True)
    return CompactConfig(log_dirs=(str(logs),), lake=str(lake), topics=(topic,), buckets=buckets)


def _start_s3() -> tuple[Any, str]:
    """moto's S3 server (the tests' fixture class), a bucket, the AWS environment set."""
    from tests.fixtures.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Server

    server = S3Server()
    os.environ.update(
        AWS_ENDPOINT_URL=server.endpoint,
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_REGION=REGION,
    )
    server.client().create_bucket(Bucket="bench-compact")
    return server, "s3://bench-compact"


def _upload(server: Any, source: Path, bucket: str, prefix: str) -> None:
    """Every file under ``source`` put into ``bucket`` under ``prefix`` (boto3, one PUT per
    file): an input built on local disk (``--cache``) becomes the same table on S3 (a Delta
    table's log names its files relative to its root)."""
    from boto3.s3.transfer import TransferConfig

    client = server.client()
    config = TransferConfig(multipart_threshold=4 << 30, max_concurrency=2)
    for f in sorted(source.rglob("*")):
        if f.is_file() and f.name != "done":
            key = f"{prefix}/{f.relative_to(source).as_posix()}"
            client.upload_file(str(f), bucket, key, Config=config)


def _memory_kib(pid: int) -> dict[str, int]:
    """A process's resident and peak resident memory (``/proc/<pid>/status``), KiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


def _cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_s(root: int, *, skip: int | None = None) -> float:
    """CPU seconds (user + system, with reaped children's) of ``root`` and every process under
    it except ``skip``'s subtree: the bench's driver, Spark's JVM and its Python workers."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = sum(int(f) for f in fields[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        if pid != skip:
            total += ticks.get(pid, 0)
            todo.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def _timed_compact(spark: Any, lake: Path | str, topic: str, buckets: int) -> tuple[float, Any]:
    t0 = time.perf_counter()
    summary = run_compact(spark, _config(lake, topic, buckets), topics=[topic], log=_quiet)
    return time.perf_counter() - t0, summary.topics[0]


def python_dict(lake: Path, topic: str, limit: int) -> dict[str, float]:
    t0 = time.perf_counter()
    dt = DeltaTable(str(lake / "records"))
    data = pa.table(dt.to_pyarrow_table(columns=["topic", "partition", "key", "value"]))
    data = data.filter(pa.compute.equal(data.column("topic"), topic)).slice(0, limit)
    keys = data.column("key").to_pylist()
    values = data.column("value").to_pylist()
    parts = data.column("partition").to_pylist()
    t1 = time.perf_counter()
    latest: dict[tuple[int, bytes], bytes | None] = {}
    for p, k, v in zip(parts, keys, values, strict=True):
        if v is None:
            latest.pop((p, k), None)
        else:
            latest[(p, k)] = v
    t2 = time.perf_counter()
    n = len(keys)
    return {
        "records": n,
        "loop_records_per_s": n / (t2 - t1),
        "with_conversion_records_per_s": n / (t2 - t0),
        "live_keys": len(latest),
    }


def spark_write(spark: Any, n: int, value_bytes: int, out: Path) -> float:
    from pyspark.sql import functions as sf

    df = spark.range(n).select(
        sf.lpad(sf.col("id").cast("string"), 12, "0").cast("binary").alias("key"),
        sf.expr(f"cast(repeat(cast(id % 10 as string), {value_bytes}) as binary)").alias("value"),
        sf.col("id").alias("offset"),
    )
    t0 = time.perf_counter()
    df.write.mode("overwrite").parquet(str(out))
    return n / (time.perf_counter() - t0)


def write_log_topic(
    log_dir: Path,
    topic: str,
    n: int,
    *,
    key_space: int,
    value_bytes: int,
    partitions: int,
    batch: int,
    rng: np.random.Generator,
    by_key: bool = False,
) -> list[np.ndarray]:
    """Segments of a compacted topic holding ``n`` records (keys uniform over ``key_space``,
    12 bytes; random values); per partition, every record's key id in offset order (whole
    batches: a partition's last partial batch is left out). Records go to the partitions in
    turn (``n / partitions`` each, every partition drawing from all keys), or, ``by_key``,
    to partition ``key id % partitions`` as a keyed producer's partitioner does. One batch
    is built by ``build_batch`` as a template; the others are that template with their
    keys and values written in place (numpy) and a fresh CRC."""
    from logstore.protocol.batch import CRC_OFFSET, HEADER_SIZE, compute_crc
    from logstore.protocol.records import build_batch
    from logstore.protocol.varint import decode_varint
    from logstore.storage.checkpoints import write_offset_checkpoint
    from logstore.storage.config import LogConfig
    from logstore.storage.log import Log
    from logstore.storage.topic_config import write_topic_config

    props = {"cleanup.policy": "compact", "segment.bytes": str(8 << 20)}
    write_topic_config(log_dir, topic, props)
    template = build_batch(
        [(b"k" * 12, b"v" * value_bytes, [], 1_700_000_000_000)] * batch, codec=0
    )
    size = len(template)
    key_pos = np.empty(batch, np.int64)
    value_pos = np.empty(batch, np.int64)
    p = HEADER_SIZE
    for i in range(batch):  # record: length, attributes, ts delta, offset delta, key, value
        length, q = decode_varint(template, p)
        r = q + 1
        _, r = decode_varint(template, r)  # timestamp delta (0)
        _, r = decode_varint(template, r)  # offset delta
        _, r = decode_varint(template, r)  # key length
        key_pos[i] = r
        _, r = decode_varint(template, r + 12)  # value length
        value_pos[i] = r
        p = q + length
    key_idx = (key_pos[:, None] + np.arange(12)).reshape(-1)
    value_idx = (value_pos[:, None] + np.arange(value_bytes)).reshape(-1)
    config = LogConfig.from_properties(props)
    ids = rng.integers(0, key_space, n)
    per_part = n // partitions
    ends = {}
    group = 64  # batches per append
    written = []
    for part in range(partitions):
        mine = (
            ids[ids % partitions == part]
            if by_key
            else ids[part * per_part : (part + 1) * per_part]
        )
        mine = mine[: len(mine) - len(mine) % batch]
        written.append(mine)
        log = Log.open(log_dir / f"{topic}-{part}", config)
        for start in range(0, len(mine), batch * group):
            chunk = mine[start : start + batch * group]
            k = len(chunk) // batch
            keys = np.char.zfill(chunk[: k * batch].astype("U12"), 12).astype("S12")
            buf = np.tile(np.frombuffer(template, np.uint8), (k, 1))
            buf[:, key_idx] = keys.view(np.uint8).reshape(k, batch * 12)
            buf[:, value_idx] = rng.integers(0, 256, (k, batch * value_bytes), dtype=np.uint8)
            out = bytearray(buf.tobytes())
            for b in range(k):
                crc = compute_crc(out, b * size, size)
                out[b * size + CRC_OFFSET : b * size + CRC_OFFSET + 4] = crc.to_bytes(4, "big")
            log.append(out)
        ends[(topic, part)] = log.log_end_offset
        log.roll()
        log.close()
    write_offset_checkpoint(log_dir / "replication-offset-checkpoint", ends)
    return written


def log_section(
    spark: Any, args: argparse.Namespace, work: Path, rng: np.random.Generator
) -> dict[str, Any]:
    from pipelines.compaction.log import run_log_compaction

    warm = work / "log-warm"
    warm.mkdir()
    write_log_topic(warm, "w", 4000, key_space=100, value_bytes=10, partitions=2, batch=100,
                    rng=rng)  # fmt: skip
    run_log_compaction(spark, [warm], force=True)

    log_dir = work / "log"
    log_dir.mkdir()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    per_partition = write_log_topic(log_dir, "t", args.records, key_space=args.keys,
                                    value_bytes=args.value_bytes, partitions=args.partitions,
                                    batch=args.log_batch, rng=rng,
                                    by_key=args.log_partitioner == "key")  # fmt: skip
    setup = time.perf_counter() - t0
    n = sum(len(ids) for ids in per_partition)
    size = sum(f.stat().st_size for f in log_dir.glob("t-*/*.log"))
    # the baselines read the same segments before the pass replaces them
    limit = min(args.baseline_records, n)
    page_cache("log.python_decode_dict", [log_dir / "t-0"], args.page_cache)
    decoded = python_decode_dict(log_dir / "t-0", limit)
    page_cache("log.python_cleaner", [log_dir / "t-0"], args.page_cache)
    cleaner = python_cleaner(log_dir / "t-0", work / "log-cleaner", limit)
    page_cache("log.full", [log_dir], args.page_cache)
    t0 = time.perf_counter()
    results = run_log_compaction(spark, [log_dir], force=True)
    seconds = time.perf_counter() - t0
    assert all(r.swapped for r in results), results
    records_out = sum(r.records_out for r in results)
    assert sum(r.records_in for r in results) == n
    # every key id's last occurrence per partition survives, nothing else
    live = sum(len(np.unique(ids)) for ids in per_partition)
    assert records_out == live, (records_out, live)
    per_part = n // args.partitions

    # why records_out is what it is: the whole log is cleanable (force=True; the active
    # segment is empty after the roll; min.compaction.lag.ms 0; no checkpoint yet, so every
    # segment is dirty), so what stays is one record per distinct (partition, key)
    expected = args.partitions * args.keys * (1 - np.exp(-per_part / args.keys))
    cleanable = sum(r.records_in for r in results)
    why = (
        f"{cleanable} of {n} records were cleanable (force=True, active segment empty after "
        f"the roll, min.compaction.lag.ms 0); {records_out} remain = the distinct (partition, "
        f"key) pairs: {args.log_partitioner!r} partitioner, "
        + (
            f"every partition draws its {per_part} records from all {args.keys} keys, so each "
            f"holds ~keys*(1-exp(-{per_part}/keys)) distinct keys (expected {expected:.0f} in "
            "all); Kafka keeps one record per key per partition"
            if args.log_partitioner == "random"
            else "a key lives in one partition (key id % partitions, as a keyed producer), so "
            "about one record per key remains"
        )
    )

    # (a) one process, a dict over the same keys as Python bytes (the loop alone)
    prefix = per_partition[0][:limit]
    t1 = time.perf_counter()
    keys = np.char.zfill(prefix.astype("U12"), 12).astype("S12").tolist()
    t2 = time.perf_counter()
    latest: dict[bytes, int] = {}
    for offset, key in enumerate(keys):
        latest[key] = offset
    t3 = time.perf_counter()
    full_rate = n / seconds
    out = {
        "records": n,
        "log_mib": round(size / 2**20),
        "setup_s": setup,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "full": {
            "seconds": seconds,
            "records_per_s": full_rate,
            "records_out": records_out,
            "bytes_out": sum(r.bytes_out for r in results),
            "why_records_out": why,
            "task_steps_s": _steps(results),
        },
        "python_dict": {
            "what": "keys already in memory (numpy -> Python bytes), dict dedupe; no I/O, "
            "no decoding",
            "records": len(keys),
            "loop_records_per_s": len(keys) / (t3 - t2),
            "with_conversion_records_per_s": len(keys) / (t3 - t1),
        },
        "python_decode_dict": decoded,
        "python_cleaner": cleaner,
    }
    out["ratios"] = {
        "full_vs_python_dict_loop": full_rate / out["python_dict"]["loop_records_per_s"],
        "full_vs_python_decode_dict": full_rate / decoded["records_per_s"],
        "full_vs_python_cleaner": full_rate / cleaner["records_per_s"],
    }
    out["full_vs_python_dict_loop"] = out["ratios"]["full_vs_python_dict_loop"]
    return out


def _steps(results: list[Any]) -> dict[str, float]:
    """Per-step seconds of the Spark tasks (clean_partition's ``extra``), summed over the
    partitions: ``*_cpu`` thread CPU, else wall; ``swap``: the driver's offline swap of each
    partition (wall; a few run at once)."""
    total: dict[str, float] = {}
    for r in results:
        for k, v in r.extra.items():
            if k.endswith("_us"):
                total[k[:-3]] = total.get(k[:-3], 0.0) + v / 1e6
    return {k: round(v, 3) for k, v in sorted(total.items())}


def _prefix_segments(part_dir: Path, limit: int) -> list[Path]:
    """The first segments of ``part_dir`` holding at least ``limit`` records (whole ones)."""
    from logstore.storage.cleaner import scan_segment

    out = []
    count = 0
    for path in sorted(part_dir.glob("*.log")):
        ref, _ = scan_segment(path)
        if ref.size == 0:
            continue
        out.append(path)
        count += ref.next_offset - ref.base_offset
        if count >= limit:
            break
    return out


def python_decode_dict(part_dir: Path, limit: int) -> dict[str, Any]:
    """Baseline (a), faithful: one process reads segment files of one partition and decodes
    every record with the project's pure-Python reference decoder
    (:mod:`pipelines.decode.reference`: ``validate_batch`` for the CRC, kafka-python's
    ``DefaultRecordBatch`` for the records: the decoder benchmark's pure-Python baseline),
    keeping each key's last offset in a dict (a cleaner thread's key map). Whole segments
    until ``limit`` records; the rate is records/s of that prefix."""
    import struct

    from kafka.record.default_records import DefaultRecordBatch

    from logstore.protocol.batch import validate_batch

    frame = struct.Struct(">qi")
    paths = _prefix_segments(part_dir, limit)
    t0 = time.perf_counter()
    latest: dict[bytes | None, int] = {}
    n = 0
    for path in paths:
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            _, length = frame.unpack_from(data, pos)
            chunk = data[pos : pos + length + 12]
            pos += length + 12
            if validate_batch(chunk, 0).is_control:
                continue
            for r in DefaultRecordBatch(bytearray(chunk)):
                if r.key is not None:
                    latest[r.key] = r.offset
                n += 1
    seconds = time.perf_counter() - t0
    return {
        "what": "read the segment files + pure-Python reference decode (CRC, kafka-python "
        "DefaultRecordBatch) + dict of key -> last offset, one process, partition 0 prefix",
        "records": n,
        "seconds": seconds,
        "records_per_s": n / seconds,
        "live_keys": len(latest),
    }


def python_cleaner(part_dir: Path, scratch: Path, limit: int) -> dict[str, Any]:
    """Baseline (a) as a whole cleaner thread: the storage layer's cleaner
    (:mod:`logstore.storage.cleaner`, what the Spark task runs, there with compiled parts) in
    one process with its pure-Python parts only: plan, key map from
    ``iter_segment_records`` (the reference record decoder) into a dict, ``rewrite_group``
    with its Python record loop (no compiled selector), into ``.cleaned`` segments. No swap.
    On hard links of partition 0's first segments (whole ones, >= ``limit`` records) plus an
    empty active segment so that all of them are cleanable."""
    from array import array

    from logstore.storage.cleaner import CleanerSettings, iter_segment_records, plan_cleaning
    from logstore.storage.cleaner import rewrite_group as rewrite
    from logstore.storage.config import LogConfig
    from logstore.storage.topic_config import write_topic_config

    paths = _prefix_segments(part_dir, limit)
    props = {"cleanup.policy": "compact", "segment.bytes": str(8 << 20)}
    scratch.mkdir(parents=True, exist_ok=True)
    write_topic_config(scratch, "t", props)
    d = scratch / "t-0"
    d.mkdir()
    for path in paths:
        os.link(path, d / path.name)
    from logstore.storage.cleaner import scan_segment

    end = scan_segment(paths[-1])[0].next_offset
    (d / f"{end:020d}.log").touch()
    settings = CleanerSettings.from_topic(LogConfig.from_properties(props), props)
    t0 = time.perf_counter()
    plan = plan_cleaning(d, settings, high_watermark=end)
    latest: dict[bytes, tuple[int, bool]] = {}
    n = 0
    for rec in iter_segment_records(d, plan.segments):
        n += 1
        if rec.key is not None:
            latest[rec.key] = (rec.offset, rec.value is None)
    keep = array("q", sorted(o for o, _ in latest.values()))
    dead = array("q", sorted(o for o, t in latest.values() if t))
    t1 = time.perf_counter()
    out_records = 0
    for group in plan.groups:
        cleaned = rewrite(d, group, keep=keep, tombstones=dead, settings=settings,
                          producer_last_offsets=plan.producer_last_offsets)  # fmt: skip
        out_records += cleaned.records_out
    t2 = time.perf_counter()
    shutil.rmtree(scratch, ignore_errors=True)
    return {
        "what": "the storage layer's cleaner in one thread, pure-Python parts only: plan + "
        "key map over the reference record decoder (dict) + rewrite_group's Python loop "
        "(no swap), partition 0 prefix",
        "records": n,
        "records_out": out_records,
        "seconds": t2 - t0,
        "key_map_s": t1 - t0,
        "rewrite_s": t2 - t1,
        "records_per_s": n / (t2 - t0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--new-records", type=int, default=None, help="default: --keys")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--baseline-records", type=int, default=2_000_000)
    parser.add_argument("--log-batch", type=int, default=500, help="records per log batch")
    parser.add_argument(
        "--log-partitioner",
        choices=["random", "key"],
        default="random",
        help="log section: records go to partitions in turn, every partition drawing from all "
        "keys (random; ~3.67M of 10M records stay with 1M keys and 4 partitions) or by key "
        "id %% partitions, as a keyed producer does (key; ~1M stay)",
    )
    parser.add_argument("--only", choices=["all", "table", "log"], default="all")
    parser.add_argument(
        "--lake",
        choices=["local", "s3"],
        default="local",
        help="s3: the incremental figures only, the lake on a local moto S3 server",
    )
    parser.add_argument("--keep", help="work in this directory and keep it")
    parser.add_argument("--cache", help="keep the generated inputs here and reuse them")
    parser.add_argument("--skip-full", action="store_true", help="only the incremental figures")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of the incremental pair (small then large, each on a fresh copy of its "
        "input); the figures are the round of the median ratio, every round under rounds",
    )
    parser.add_argument(
        "--build-only",
        action="store_true",
        help="with --cache: build the incremental cases' inputs into the cache and stop, "
        "nothing measured (the slow 10M-key build can then run outside the benchmark lock)",
    )
    parser.add_argument(
        "--page-cache",
        choices=_PAGE_CACHE_MODES,
        default="warm",
        help="input files' page-cache state before each measured step, the job's and the "
        "baselines' alike: warm (read once first), cold (drop the page cache; root only), "
        "as-is",
    )
    args = parser.parse_args()
    if args.build_only and (not args.cache or args.lake != "local"):
        parser.error("--build-only needs --cache and the local lake")
    new_records = args.new_records or args.keys
    server, s3_root = _start_s3() if args.lake == "s3" else (None, "")
    if server is not None:
        args.only, args.skip_full = "table", True
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pipelines.session import get_spark

    spark = get_spark(
        "bench-compact",
        master="local[2]",
        conf={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "8",
            "spark.sql.session.timeZone": "UTC",
            "spark.driver.memory": "4g",
        },
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-compact-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = None
    if args.cache:
        sizes = f"r{args.records}-k{args.keys}-v{args.value_bytes}-p{args.partitions}"
        cache = Path(args.cache) / f"{sizes}-n{new_records}-b{args.buckets}"
        cache.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    results: dict[str, Any] = {"args": vars(args)}
    try:
        if args.only in ("all", "log"):
            results["log"] = log_section(spark, args, work, rng)
        if args.only == "log":
            return
        # warm-up: starts the Python workers; the second run merges into existing rows (the
        # incremental path's kernels loaded in every worker before the measured runs)
        warm: Path | str = work / "warm" if server is None else f"{s3_root}/warm"
        warm_offsets = [0]
        for _ in range(2):
            append_records(warm, "w", 1000, key_space=100, value_bytes=10, partitions=1,
                           next_offsets=warm_offsets, rng=rng)  # fmt: skip
            _timed_compact(spark, warm, "w", args.buckets)

        def full_input(lake: Path) -> None:
            append_records(lake, "t", args.records, key_space=args.keys,
                           value_bytes=args.value_bytes, partitions=args.partitions,
                           next_offsets=[0] * args.partitions,
                           rng=np.random.default_rng(7))  # fmt: skip

        t0 = time.perf_counter()
        # the full run's input: not built when only the incremental figures are wanted
        lake = _cached(cache, "full", work, full_input) if not args.skip_full else work
        results["setup_records_s"] = time.perf_counter() - t0
        if not args.skip_full:
            page_cache("full", [lake], args.page_cache)
        seconds, res = (
            _timed_compact(spark, lake, "t", args.buckets) if not args.skip_full else (0.0, None)
        )
        if not args.skip_full:
            # the topic table takes deletion vectors: read with a reader that honours them
            rows = len(pl.scan_delta(table_path(lake, "t")).select("key").collect())
            results["full"] = {
                "seconds": seconds,
                "records_per_s": args.records / seconds,
                "live_keys": rows,
                "inserted": res.inserted,
                "steps_seconds": res.seconds,
            }
            page_cache("python_dict", [lake / "records"], args.page_cache)
            results["python_dict"] = python_dict(lake, "t", args.baseline_records)
            results["spark_write_rows_per_s"] = spark_write(
                spark, args.records, args.value_bytes, work / "plain"
            )
            results["full_vs_python_dict_loop"] = (
                results["full"]["records_per_s"] / results["python_dict"]["loop_records_per_s"]
            )
            results["full_vs_python_dict_with_conversion"] = (
                results["full"]["records_per_s"]
                / results["python_dict"]["with_conversion_records_per_s"]
            )
            results["full_vs_spark_write"] = (
                results["full"]["records_per_s"] / results["spark_write_rows_per_s"]
            )

        # incremental: new records into a table of --keys keys vs one of 10x --keys keys
        # incremental: new records into a table of --keys keys vs one of 10x --keys keys, in
        # --repeat rounds (each on a fresh copy of the inputs)
        moto_pid = server._process.pid if server is not None else None
        rounds: list[dict[str, Any]] = []
        for round_no in range(args.repeat):
            this: dict[str, Any] = {}
            for name, keys in (("small", args.keys), ("large", 10 * args.keys)):

                def incremental_input(lake_i: Path | str, keys: int = keys) -> None:
                    # a table of ``keys`` keys, compacted, then the new records (not compacted)
                    offs = [0] * args.partitions
                    common = {"value_bytes": args.value_bytes, "partitions": args.partitions,
                              "rng": np.random.default_rng(keys)}  # fmt: skip
                    append_records(lake_i, "t", keys, key_space=keys, next_offsets=offs,
                                   unique=True, **common)  # fmt: skip
                    _timed_compact(spark, lake_i, "t", args.buckets)
                    append_records(lake_i, "t", new_records, key_space=keys, next_offsets=offs,
                                   **common)  # fmt: skip

                case: dict[str, Any] = {"table_keys": keys, "new_records": new_records}
                if server is None:
                    lake_i: Path | str = _cached(cache, f"inc-{name}", work, incremental_input)
                    if args.build_only:
                        continue
                    page_cache(f"incremental.{name}", [Path(lake_i)], args.page_cache)
                elif cache is None:
                    lake_i = f"{s3_root}/inc-{name}-{round_no}"
                    incremental_input(lake_i)
                else:
                    # built on local disk (or taken from the cache), then put into the bucket
                    built = _cached(cache, f"inc-{name}", work, incremental_input)
                    t_up = time.perf_counter()
                    _upload(server, built, "bench-compact", f"inc-{name}-{round_no}")
                    case["upload_s"] = time.perf_counter() - t_up
                    lake_i = f"{s3_root}/inc-{name}-{round_no}"
                moto_cpu = _cpu_s(moto_pid) if moto_pid is not None else 0.0
                job_cpu = _tree_cpu_s(os.getpid(), skip=moto_pid)
                seconds, res = _timed_compact(spark, lake_i, "t", args.buckets)
                case["cpu_s"] = _tree_cpu_s(os.getpid(), skip=moto_pid) - job_cpu
                if moto_pid is not None:
                    case["moto_cpu_s"] = _cpu_s(moto_pid) - moto_cpu
                    case["moto_memory_kib"] = _memory_kib(moto_pid)
                this[name] = {
                    **case,
                    "seconds": seconds,
                    "buckets_rewritten": res.buckets_rewritten,
                    "buckets_with_deletion_vectors": res.buckets_with_deletion_vectors,
                    "inserted": res.inserted,
                    "updated": res.updated,
                    "steps_seconds": res.seconds,
                }
            if args.build_only:
                return
            small, large = this["small"], this["large"]
            this["ratio_large_to_small"] = large["seconds"] / small["seconds"]
            # the job's processes plus the S3 server's (both on this machine's cores)
            cpu = {
                n: c["cpu_s"] + c.get("moto_cpu_s", 0.0)
                for n, c in (("small", small), ("large", large))
            }
            this["cpu_ratio_large_to_small"] = cpu["large"] / cpu["small"]
            this["load_avg_after"] = os.getloadavg()
            rounds.append(this)
        by_ratio = sorted(rounds, key=lambda r: r["ratio_large_to_small"])
        incremental = {
            **by_ratio[len(by_ratio) // 2],  # the round of the median ratio (upper, if even)
            "ratios_large_to_small": [r["ratio_large_to_small"] for r in rounds],
            "cpu_ratios_large_to_small": [r["cpu_ratio_large_to_small"] for r in rounds],
            "rounds": rounds,
        }
        results["incremental"] = incremental
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        results["page_cache"] = _page_cache_log
        if server is not None:
            server.close()
        print(json.dumps(results))


if __name__ == "__main__":
    main()
