"""One bucket's incremental merge (``merge.merge_bucket``, in this process, no Spark) against
the reference model, over many random batches: the live rows, the tombstone rows, and the
change feed (insert / update pre+post / delete) after every batch.

The Spark tests (tests/integration/compaction) run few examples; this one runs many, including
the state a run killed between its two commits leaves (the tombstone table ahead).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import struct
import tempfile
import uuid
import zlib
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.compaction.merge import TaskPlan, merge_bucket
from pipelines.compaction.model import Rec, Strategy, latest, parse_strategy
from pipelines.compaction.table import (
    BUCKET,
    CHANGE_TYPE,
    SRC,
    TABLE_SCHEMA,
)
from pipelines.delta.files import PartitionedFileWriter
from pipelines.sources import RECORDS_ARROW_SCHEMA

_HEADERS = RECORDS_ARROW_SCHEMA.field("headers").type


def _rows(recs: list[Rec]) -> pa.Table:
    n = len(recs)
    return pa.table(
        {
            "partition": pa.array([r.partition for r in recs], pa.int32()),
            "key": pa.array([r.key for r in recs], pa.binary()),
            "value": pa.array([r.value for r in recs], pa.binary()),
            "headers": pa.array(
                [[{"key": k, "value": v} for k, v in r.headers] for r in recs], _HEADERS
            ),
            "offset": pa.array([r.offset for r in recs], pa.int64()),
            "timestamp": pa.array(
                [dt.datetime.fromtimestamp(r.timestamp / 1000, tz=dt.UTC) for r in recs],
                pa.timestamp("us", tz="UTC"),
            ),
            "timestamp_type": pa.array([0] * n, pa.int32()),
            BUCKET: pa.array([0] * n, pa.int32()),
            SRC: pa.array([0] * n, pa.int32()),
        }
    )


class _Bucket:
    """A bucket's files as the driver tracks them between runs."""

    def __init__(self, root: str, strategy: Strategy, dv: bool = False) -> None:
        self.root = root
        self.tomb_root = os.path.join(root, "tomb") if strategy.kind != "offset" else None
        self.strategy = strategy
        self.dv = dv
        self.main: list[str] = []
        self.tomb: list[str] = []
        self.deleted: dict[str, np.ndarray] = {}  # a main file's deletion vector

    def merge(self, recs: list[Rec]) -> tuple[dict, list[dict]]:
        plan = TaskPlan(
            root=self.root,
            tomb_root=self.tomb_root,
            write_id=uuid.uuid4().hex,
            strategy=self.strategy,
            full=False,
            compression="zstd",
            max_rows_per_file=7,
            main_files={0: self.main},
            tomb_files={0: self.tomb},
            deleted=dict(self.deleted),
            deletion_vectors=self.dv,
        )
        common = {
            "write_id": plan.write_id,
            "task_id": 0,
            "attempt": 0,
            "partition_by": [BUCKET],
            "compression": "zstd",
            "max_rows_per_file": 7,
        }
        roots = {"main": self.root, "cdc": os.path.join(self.root, "_change_data")}
        if self.tomb_root is not None:
            roots["tomb"] = self.tomb_root
        writers = {k: PartitionedFileWriter(r, **common) for k, r in roots.items()}
        report = merge_bucket(0, _rows(recs), plan, writers)
        files = {k: [os.path.join(roots[k], unquote(f.path)) for f in w.close()]
                 for k, w in writers.items()}  # fmt: skip
        if "dv" in report:
            self.main = self.main + files["main"]
            for path, desc, dv_file in report["dv"]:
                self.deleted[path] = _read_dv(dv_file, desc)
        elif report["changed"]:
            self.main = files["main"]
            self.deleted = {}
        else:
            assert not files["main"] and not files["cdc"]
        if self.tomb_root is not None and report["tomb_changed"]:
            self.tomb = files["tomb"]
        cdc = _read(files["cdc"])
        return report, cdc

    def rows(self, which: str) -> dict[tuple[int, bytes], int]:
        out: dict[tuple[int, bytes], int] = {}
        paths = self.main if which == "main" else self.tomb
        rows = [
            r
            for p in paths
            for i, r in enumerate(pq.read_table(p).to_pylist())
            if i not in set(self.deleted.get(p, np.zeros(0)).tolist())
        ]
        for r in rows:
            pk = (r["partition"], r["key"])
            assert pk not in out, f"two rows for {pk}"
            out[pk] = r["offset"]
        return out


def _read_dv(path: str, desc: dict) -> np.ndarray:
    """The deleted positions of a deletion vector (array and bitmap containers, as written)."""
    with open(path, "rb") as fh:
        fh.seek(desc["offset"])
        size = struct.unpack(">i", fh.read(4))[0]
        data = fh.read(size)
        crc = struct.unpack(">I", fh.read(4))[0]
    assert size == desc["sizeInBytes"] and zlib.crc32(data) == crc
    magic, bitmaps, high, cookie, n = struct.unpack("<iqiII", data[:24])
    assert (magic, bitmaps, high, cookie) == (1681511377, 1, 0, 12346)
    keys = np.frombuffer(data, "<u2", 2 * n, 24).reshape(n, 2)
    starts = np.frombuffer(data, "<u4", n, 24 + 4 * n)
    out = []
    for (key, card1), start in zip(keys.tolist(), starts.tolist(), strict=True):
        body = data[16 + start :]  # offsets count from the 32-bit bitmap (byte 16)
        if card1 < 4096:
            low = np.frombuffer(body, "<u2", card1 + 1)
        else:
            bits = np.unpackbits(np.frombuffer(body, np.uint8, 8192), bitorder="little")
            low = np.nonzero(bits)[0]
        out.append((key << 16) + low.astype(np.int64))
    positions = np.concatenate(out) if out else np.zeros(0, np.int64)
    assert len(positions) == desc["cardinality"]
    return positions


def _read(paths: list[str]) -> list[dict]:
    return [r for p in paths for r in pq.read_table(p).to_pylist()]


workload = st.lists(
    st.tuples(
        st.integers(0, 1),  # partition
        st.one_of(st.sampled_from([b"a", b"b", b"c", b"\x00", b""]), st.none()),
        st.one_of(st.binary(max_size=2), st.none()),  # None: tombstone
        st.integers(0, 3),  # timestamp (ties are frequent)
        st.one_of(st.none(), st.binary(max_size=2)),  # header "v"
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(
    workload,
    st.sampled_from(["offset", "timestamp", "header:v"]),
    st.lists(st.integers(0, 25), max_size=3),
    st.booleans(),
    st.booleans(),
)
def test_incremental_bucket_merge_equals_the_model(
    raw: list[tuple], strategy_text: str, cuts: list[int], replay: bool, dv: bool
) -> None:
    strategy = parse_strategy(strategy_text)
    recs: list[Rec] = []
    offsets = [0, 0]
    for p, key, value, ts, header in raw:
        headers = () if header is None else (("v", header),)
        recs.append(Rec(p, offsets[p], 1_700_000_000_000 + ts, key, value, headers))
        offsets[p] += 1
    bounds = sorted({0, len(recs), *(c for c in cuts if c < len(recs))})
    with tempfile.TemporaryDirectory() as tmp:
        bucket = _Bucket(tmp, strategy, dv)
        before: dict = {}
        for lo, hi in itertools.pairwise(bounds):
            report, cdc = bucket.merge(recs[lo:hi])
            if replay:
                # the same records merged again (a re-run that read them twice) change nothing
                again, again_cdc = bucket.merge(recs[lo:hi])
                assert not again["changed"] and not again.get("tomb_changed") and not again_cdc
            state = latest(recs[:hi], strategy)
            want = {pk: r.offset for pk, r in state.items() if r.value is not None}
            assert bucket.rows("main") == want
            if bucket.tomb_root is not None:
                tombs = {pk: r.offset for pk, r in state.items() if r.value is None}
                assert bucket.rows("tomb") == tombs
            got = sorted((r[CHANGE_TYPE], r["partition"], r["key"], r["offset"]) for r in cdc)
            expect = []
            for pk in sorted(set(before) | set(want)):
                if pk not in before:
                    expect.append(("insert", *pk, want[pk]))
                elif pk not in want:
                    expect.append(("delete", *pk, before[pk]))
                elif before[pk] != want[pk]:
                    expect.append(("update_postimage", *pk, want[pk]))
                    expect.append(("update_preimage", *pk, before[pk]))
            assert got == sorted(expect)
            assert report.get("inserted", 0) == sum(e[0] == "insert" for e in expect)
            before = want


def test_replay_of_a_half_committed_run() -> None:
    """The tombstone table ahead of the rows (killed between commits): the re-run deletes."""
    strategy = Strategy("timestamp")
    with tempfile.TemporaryDirectory() as tmp:
        bucket = _Bucket(tmp, strategy)
        bucket.merge([Rec(0, 0, 100, b"k", b"v", ())])
        live_files = list(bucket.main)
        bucket.merge([Rec(0, 1, 200, b"k", None, ())])
        assert bucket.rows("main") == {} and bucket.rows("tomb") == {(0, b"k"): 1}
        bucket.main = live_files  # the rows' commit never happened
        report, cdc = bucket.merge([Rec(0, 1, 200, b"k", None, ())])
        assert report["deleted"] == 1
        assert [(r[CHANGE_TYPE], r["offset"]) for r in cdc] == [("delete", 0)]
        assert bucket.rows("main") == {} and bucket.rows("tomb") == {(0, b"k"): 1}


def test_table_schema_unchanged() -> None:
    assert np.array_equal(
        TABLE_SCHEMA.names,
        ["partition", "key", "value", "headers", "offset", "timestamp", "timestamp_type",
         "version", "bucket"],
    )  # fmt: skip


def test_a_file_keeps_its_deleted_rows_across_deletion_vectors() -> None:
    """Rows of one file replaced over several runs: each new vector holds the old ones too."""
    strategy = Strategy()
    with tempfile.TemporaryDirectory() as tmp:
        bucket = _Bucket(tmp, strategy, dv=True)
        recs = [Rec(0, o, 1, b"k%02d" % o, b"v") for o in range(40)]
        bucket.merge(recs)
        first = bucket.main[0]
        for o, k in enumerate([0, 1, 2, 3], start=40):
            rec = Rec(0, o, 1, b"k%02d" % k, b"w")
            recs.append(rec)
            report, _cdc = bucket.merge([rec])
            assert [path for path, _d, _f in report["dv"]] == [first]
            state = latest(recs, strategy)
            assert bucket.rows("main") == {pk: r.offset for pk, r in state.items()}
        assert sorted(bucket.deleted[first].tolist()) == [0, 1, 2, 3]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(["offset", "timestamp", "header:v"]),
    st.lists(
        st.lists(st.tuples(st.integers(0, 59), st.booleans(), st.integers(0, 3)), max_size=12),
        min_size=1,
        max_size=4,
    ),
)
def test_deletion_vector_merges_give_the_exact_change_feed(
    strategy_text: str, rounds: list[list[tuple[int, bool, int]]]
) -> None:
    """A bucket of 60 keys in several files, then small batches (updates, tombstones, ties)
    merged with deletion vectors: the live rows equal the model's after every batch, and every
    change-feed row is the whole row (value, headers, timestamp, offset) the model says."""
    strategy = parse_strategy(strategy_text)
    keys = [b"key-%02d" % i for i in range(60)]
    recs = [Rec(i % 2, i // 2, 1_700_000_000_000, k, b"v0-%d" % i) for i, k in enumerate(keys)]
    offsets = [30, 30]
    with tempfile.TemporaryDirectory() as tmp:
        bucket = _Bucket(tmp, strategy, dv=True)
        bucket.merge(recs)
        before = latest(recs, strategy)
        for n, batch in enumerate(rounds):
            new = []
            for i, tombstone, ts in batch:
                p = i % 2
                value = None if tombstone else b"v%d-%d" % (n + 1, i)
                headers = (("v", bytes([ts])),)
                new.append(Rec(p, offsets[p], 1_700_000_000_000 + ts, keys[i], value, headers))
                offsets[p] += 1
            recs += new
            report, cdc = bucket.merge(new)
            state = latest(recs, strategy)
            assert bucket.rows("main") == {
                pk: r.offset for pk, r in state.items() if r.value is not None
            }
            live_before = {pk: r for pk, r in before.items() if r.value is not None}
            live_now = {pk: r for pk, r in state.items() if r.value is not None}

            def row(change: str, r: Rec) -> tuple:
                ts = dt.datetime.fromtimestamp(r.timestamp / 1000, tz=dt.UTC)
                headers = tuple((k, v) for k, v in r.headers)
                return (change, r.partition, r.key, r.value, r.offset, ts, headers)

            expect = []
            for pk in set(live_before) | set(live_now):
                old, now = live_before.get(pk), live_now.get(pk)
                if old is None and now is not None:
                    expect.append(row("insert", now))
                elif now is None and old is not None:
                    expect.append(row("delete", old))
                elif old is not None and now is not None and old.offset != now.offset:
                    expect += [row("update_preimage", old), row("update_postimage", now)]
            got = [
                (r[CHANGE_TYPE], r["partition"], r["key"], r["value"], r["offset"],
                 r["timestamp"], tuple((h["key"], h["value"]) for h in r["headers"]))
                for r in cdc
            ]  # fmt: skip
            assert sorted(got) == sorted(expect)
            if n == 0 and expect:
                assert "dv" in report  # 60 rows, at most 12 replaced: no rewrite
            before = state
