"""The swap protocol under kill -9 at every step, by the job (offline) and by the broker's log
manager: after the next load the log is either the old one or the cleaned one, exactly, with no
temporary file left; a re-run then gives the cleaned log. Plus the manifest's checks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logstore.protocol.batch import Codec
from logstore.storage.cleaner_manifest import MANIFEST_FILE, read_manifest
from logstore.storage.config import LogConfig
from logstore.storage.files import CLEANED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX
from logstore.storage.log import Log
from logstore.storage.log_manager import LogManager
from logstore.storage.topic_config import read_topic_config, write_topic_config
from pipelines.compaction.log import clean_partition, hand_over
from pipelines.compaction.model import Strategy
from tests.unit.storage.test_cleaner import NOW, _props, expected_after, read_log, write_log

_WORKLOAD = [
    ([(i % 5, None if i % 7 == 3 else b"v%d" % i, None) for i in range(j, j + 3)], codec, pid)
    for j, codec, pid in [
        (k, [Codec.NONE, Codec.GZIP, Codec.ZSTD][k % 3], [-1, 7, 8][k % 3]) for k in range(30)
    ]
]

KILLED = -signal.SIGKILL  # the failpoint SIGKILLs the process, as a kill -9 would

_SCRIPT = """
import sys
from pathlib import Path
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager
from pipelines.compaction.log import clean_partition, hand_over
mode, d, now, hw = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if mode == "job":
    clean_partition(d, now_ms=now, force=True, high_watermark=hw)
    print(hand_over(d))
else:
    # the broker runs, the job writes its cleaned segments and manifest, the broker swaps
    mgr = LogManager([d.parent], default_config=LogConfig(), background=False)
    clean_partition(d, now_ms=now, force=True, high_watermark=hw)
    print(mgr.apply_cleaner_swaps())
    mgr.shutdown()
"""


def _run(mode: str, d: Path, hw: int, failpoint: str | None) -> int:
    env = dict(os.environ)
    env.pop("LOGLAKE_FAILPOINT", None)
    if failpoint:
        env["LOGLAKE_FAILPOINT"] = failpoint
    root = Path(__file__).resolve().parents[3]
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, mode, str(d), str(NOW), str(hw)],
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode in (0, KILLED), proc.stderr.decode()
    return proc.returncode


def _triples(records):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


def _reload(d: Path) -> None:
    """What a broker start does: load (and recover) the log, then close it."""
    log = Log.open(d, LogConfig.from_properties(read_topic_config(d.parent, "t")))
    log.close()


def _leftovers(d: Path) -> list[str]:
    return sorted(
        n
        for n in os.listdir(d)
        if n.endswith((CLEANED_SUFFIX, SWAP_SUFFIX, ".deleted")) or n.startswith(MANIFEST_FILE)
    )


def _assert_consistent(now: list, before: list, want: list) -> None:
    """Groups swap one at a time: a crash may leave the first groups cleaned and the rest
    not. Consistent and nothing lost: the log holds a subset of the old records that includes
    every record the cleaned log keeps, and the same latest record for every key."""
    assert set(now) <= set(before)
    assert set(want) <= set(now)
    assert [t[0] for t in now] == sorted(t[0] for t in now)
    latest_now = {t[1]: t for t in now if t[1] is not None}
    latest_before = {t[1]: t for t in before if t[1] is not None}
    assert latest_now == latest_before


JOB_STEPS = [
    "cleaner.rewritten",
    "cleaner.before_swap",
    "cleaner.swapped",
    "cleaner.retiring",
    "cleaner.retired",
    "cleaner.live_partial",
    "cleaner.live",
    "cleaner.checkpointed",
]
BROKER_STEPS = [
    "cleaner.before_swap",
    "cleaner.swapped",
    "cleaner.retired",
    "cleaner.live_partial",
    "cleaner.live",
    "cleaner.checkpointed",
]


@pytest.mark.parametrize(
    ("mode", "step"),
    [("job", s) for s in JOB_STEPS] + [("broker", s) for s in BROKER_STEPS],
)
def test_kill_at_every_step(tmp_path: Path, mode: str, step: str) -> None:
    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    before, headers = read_log(d)
    hw = headers[-1].next_offset
    want = expected_after(before, hw, Strategy(), expired=set())
    assert len(want) < len(before)
    assert _run(mode, d, hw, step) == KILLED
    _reload(d)
    assert _leftovers(d) == []
    now = _triples(read_log(d)[0])
    _assert_consistent(now, _triples(before), want)
    # a re-run finishes the job
    res = clean_partition(d, now_ms=NOW, force=True, high_watermark=hw)
    if res.groups:
        assert hand_over(d)[0]
    final, _ = read_log(d)
    assert _triples(final) == want
    assert _leftovers(d) == []


def test_half_renamed_swap_is_discarded(tmp_path: Path) -> None:
    """``.log`` renamed to ``.swap`` but the indexes still ``.cleaned``: not committed."""
    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    before, headers = read_log(d)
    res = clean_partition(d, now_ms=NOW, force=True, high_watermark=headers[-1].next_offset)
    base = res.end_offset and read_manifest(d).groups[0].base_offset  # type: ignore[union-attr]
    src = d / f"{base:020d}{LOG_SUFFIX}{CLEANED_SUFFIX}"
    src.rename(d / f"{base:020d}{LOG_SUFFIX}{SWAP_SUFFIX}")
    _reload(d)
    assert _leftovers(d) == []
    assert _triples(read_log(d)[0]) == _triples(before)


def _tamper_cases():
    return ["crc", "appended", "offsets", "size"]


@pytest.mark.parametrize(
    ("mode", "tamper"),
    [("job", t) for t in _tamper_cases()]
    + [("broker", t) for t in _tamper_cases() if t != "appended"],
)
def test_manifest_checks_reject(tmp_path: Path, mode: str, tamper: str) -> None:
    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    # segment.bytes up after writing: the cleaner makes one group of every segment
    write_topic_config(tmp_path, "t", {**_props(), "segment.bytes": "1000000"})
    before, headers = read_log(d)
    mgr = None
    if mode == "broker":
        mgr = LogManager([tmp_path], default_config=LogConfig(), background=False)
    clean_partition(d, now_ms=NOW, force=True, high_watermark=headers[-1].next_offset)
    manifest_path = d / MANIFEST_FILE
    manifest = read_manifest(d)
    assert manifest is not None and len(manifest.groups) == 1
    group = manifest.groups[0]
    cleaned = d / f"{group.base_offset:020d}{LOG_SUFFIX}{CLEANED_SUFFIX}"
    if tamper == "crc":
        data = bytearray(cleaned.read_bytes())
        data[-1] ^= 0xFF
        cleaned.write_bytes(data)
    elif tamper == "appended":  # the replaced segment changed since the job read it
        seg = d / f"{group.replaced[-1].base_offset:020d}{LOG_SUFFIX}"
        with open(seg, "ab") as f:
            f.write((d / f"{group.base_offset:020d}{LOG_SUFFIX}").read_bytes()[: 61 + 10])
    elif tamper == "offsets":  # claims a range ending before its batches
        doc = json.loads(manifest_path.read_text())
        doc["groups"][0]["replaced"][-1]["next_offset"] = group.base_offset + 1
        manifest_path.write_text(json.dumps(doc))
    else:
        doc = json.loads(manifest_path.read_text())
        doc["groups"][0]["size"] += 1
        manifest_path.write_text(json.dumps(doc))
    if mgr is None:
        assert hand_over(d) == (False, "rejected offline")
    else:
        assert mgr.apply_cleaner_swaps() == 0
        log = mgr.get_log("t", 0)
        assert log is not None and _triples(_read_through(log)) == _triples(before)
        mgr.shutdown()
    assert _leftovers(d) == []
    if tamper != "appended":
        assert _triples(read_log(d)[0]) == _triples(before)


def _read_through(log: Log) -> list:
    """Every record the log serves, read through Log.read like a fetch."""
    from logstore.protocol.batch import iter_batches
    from logstore.protocol.records import decode_batch

    out = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        sl = log.read(offset, 1 << 20)
        data = os.pread(sl.fileno, sl.length, sl.position)
        for pos, h in iter_batches(data, allow_torn_tail=True):
            out.extend(r for r in decode_batch(data[pos : pos + h.size])[1] if r.offset >= offset)
            offset = h.next_offset
    return out


def test_broker_swap_keeps_readers_working(tmp_path: Path) -> None:
    """A log manager swaps while a reader holds a slice of an old segment and another reads
    from the middle: the old slice's descriptor still serves its bytes; reads after the swap
    see the cleaned records from the same offset on."""
    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    before, headers = read_log(d)
    hw = headers[-1].next_offset
    want = expected_after(before, hw, Strategy(), expired=set())
    # Kafka's window for in-flight fetches: the replaced files are closed a minute later
    write_topic_config(tmp_path, "t", {**_props(500), "file.delete.delay.ms": "60000"})
    mgr = LogManager([tmp_path], default_config=LogConfig(), background=False)
    try:
        log = mgr.get_log("t", 0)
        assert log is not None
        mid = before[len(before) // 2].offset
        old = log.read(mid, 1 << 20)
        old_bytes = os.pread(old.fileno, old.length, old.position)
        clean_partition(d, now_ms=NOW, force=True, high_watermark=hw)
        assert mgr.apply_cleaner_swaps() == 1
        # the in-flight slice still reads the old bytes (file renamed .deleted, fd open)
        assert os.pread(old.fileno, old.length, old.position) == old_bytes
        got = []
        offset = mid
        while offset < hw:
            sl = log.read(offset, 1 << 20)
            if sl.length == 0:
                break
            data = os.pread(sl.fileno, sl.length, sl.position)
            from logstore.protocol.batch import iter_batches
            from logstore.protocol.records import decode_batch

            for pos, h in iter_batches(data, allow_torn_tail=True):
                got.extend(r for r in decode_batch(data[pos : pos + h.size])[1] if r.offset >= mid)
                offset = h.next_offset
        assert _triples(got) == [t for t in want if t[0] >= mid]
    finally:
        mgr.shutdown()


def test_swap_completed_on_load_covers_the_whole_replaced_range(tmp_path: Path) -> None:
    """A group [A, B] whose cleaned segment ends inside A (all of B's records lost to a later
    segment): killed after the swap was committed, the loader must still delete B, using the
    manifest's range end rather than the cleaned segment's own end."""
    batches = [
        ([(1, b"a", None), (2, b"b", None)], Codec.NONE, -1),  # A: offsets 0, 1
        ([(3, b"old", None)], Codec.NONE, -1),  # B: offset 2, superseded by C
        ([(3, b"new", None)], Codec.NONE, -1),  # C: offset 3
    ]
    d = write_log(tmp_path, batches, segment_bytes=14)  # one batch per segment
    sizes = sorted((p.name, p.stat().st_size) for p in d.glob("*.log"))
    assert len(sizes) == 4  # A, B, C and the empty active segment
    group_bytes = sizes[0][1] + sizes[1][1]
    write_topic_config(tmp_path, "t", {**_props(), "segment.bytes": str(group_bytes)})
    assert _run("job", d, 4, "cleaner.swapped") == KILLED
    manifest = read_manifest(d)
    assert manifest is not None
    assert len(manifest.groups[0].replaced) == 2
    _reload(d)
    assert _leftovers(d) == []
    assert [(r.offset, r.value) for r in read_log(d)[0]] == [(0, b"a"), (1, b"b"), (3, b"new")]


def test_offline_swapper_swaps_each_partition_as_its_manifest_appears(tmp_path: Path) -> None:
    """The job's offline hand-over (no broker): the log dir's ``.lock`` is held from before the
    tasks until every swap is done, and a partition is swapped as soon as its manifest exists,
    before the job's results are in; a second manifest (a retried task's) is applied too."""
    from logstore.errors import LogDirLockedError
    from logstore.storage.dirlock import DirLock
    from pipelines.compaction.log import _OfflineSwapper

    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    before, headers = read_log(d)
    hw = headers[-1].next_offset
    want = expected_after(before, hw, Strategy(), expired=set())
    swapper = _OfflineSwapper([str(d)], poll_s=0.01)
    try:
        with pytest.raises(LogDirLockedError):
            DirLock(tmp_path).acquire()  # held for the whole run, not only for the swaps
        res = clean_partition(d, now_ms=NOW, force=True, high_watermark=hw)
        assert res.groups and (d / MANIFEST_FILE).exists()
        for _ in range(1000):  # swapped by the swapper's thread, finish() not called yet
            if not (d / MANIFEST_FILE).exists():
                break
            time.sleep(0.01)
        assert not (d / MANIFEST_FILE).exists()
        assert _triples(read_log(d)[0]) == want
        again = clean_partition(d, now_ms=NOW, force=True, high_watermark=hw)
        assert again.groups and (d / MANIFEST_FILE).exists()  # the thread saw this dir already
        swapper.finish([res])
        assert res.swapped and res.note == "swapped offline" and res.extra["swap_us"] > 0
        assert not (d / MANIFEST_FILE).exists()
    finally:
        swapper.close()
    DirLock(tmp_path).acquire()  # released
    assert _triples(read_log(d)[0]) == want
    assert _leftovers(d) == []


def test_offline_swapper_leaves_a_broker_held_log_dir_alone(tmp_path: Path) -> None:
    from pipelines.compaction.log import _OfflineSwapper

    d = write_log(tmp_path, _WORKLOAD, segment_bytes=500)
    _, headers = read_log(d)
    mgr = LogManager([tmp_path], default_config=LogConfig(), background=False)
    try:
        swapper = _OfflineSwapper([str(d)], poll_s=0.01)
        res = clean_partition(d, now_ms=NOW, force=True, high_watermark=headers[-1].next_offset)
        time.sleep(0.1)
        swapper.finish([res])
        swapper.close()
        assert res.swapped is None  # left to the broker (hand_over)
        assert (d / MANIFEST_FILE).exists()
        assert mgr.apply_cleaner_swaps() == 1
    finally:
        mgr.shutdown()
