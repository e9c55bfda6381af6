"""Recovery after an unclean shutdown: each corruption case on its own, each asserted.

A crash is simulated the way a SIGKILL leaves things: the directory is copied while the log is
still open (page cache contents, untrimmed preallocated indexes and all), then damaged.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from logstore.protocol.batch import iter_batches
from logstore.protocol.records import build_batch
from logstore.storage.files import segment_path
from logstore.storage.log import Log, LogConfig

CFG = LogConfig(segment_bytes=3000, index_interval_bytes=200, segment_index_bytes=4096)


def _batch(i: int) -> bytearray:
    return build_batch([(b"k%d" % i, b"v" * 80), (None, b"w" * 40)], base_timestamp=1000 + i)


def _written_log(tmp_path: Path, n: int = 60) -> tuple[Path, list[tuple[int, int]]]:
    """Write ``n`` 2-record batches, crash-copy the directory; return it and the batches."""
    src = tmp_path / "src" / "t-0"
    log = Log.open(src, CFG)
    for i in range(n):
        log.append(_batch(i))
    crashed = tmp_path / "crash" / "t-0"
    shutil.copytree(src, crashed)
    log.close()
    return crashed, [(2 * i, 2 * i + 1) for i in range(n)]


def _batches_of(log: Log) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for seg in log.segments:
        data = seg.path.read_bytes()
        out += [(h.base_offset, h.last_offset) for _, h in iter_batches(data)]
    return out


def _segment_files(d: Path) -> list[Path]:
    return sorted(d.glob("*.log"))


def test_crash_without_damage_recovers_everything(tmp_path: Path) -> None:
    d, batches = _written_log(tmp_path)
    log = Log.open(d, CFG)
    assert _batches_of(log) == batches and log.log_end_offset == 120
    assert log.load_result.truncated_bytes == 0
    log.close()


def test_torn_last_batch(tmp_path: Path) -> None:
    d, batches = _written_log(tmp_path)
    last = _segment_files(d)[-1]
    size = last.stat().st_size
    os.truncate(last, size - 7)
    log = Log.open(d, CFG)
    assert _batches_of(log) == batches[:-1]
    assert log.log_end_offset == batches[-2][1] + 1
    assert log.load_result.truncated_bytes == size - 7 - log.segments[-1].size
    assert log.append(_batch(99)).first_offset == batches[-2][1] + 1
    log.close()


def test_bit_flip_in_a_middle_batch_truncates_there_and_drops_later_segments(
    tmp_path: Path,
) -> None:
    d, batches = _written_log(tmp_path)
    files = _segment_files(d)
    assert len(files) >= 3
    victim = files[1]
    data = bytearray(victim.read_bytes())
    positions = [p for p, _ in iter_batches(data)]
    flip_at = positions[len(positions) // 2]
    data[flip_at + 70] ^= 0x10  # inside the records: only the CRC can tell
    victim.write_bytes(data)
    log = Log.open(d, CFG)
    base = int(victim.name[:20])
    reason = log.segments[-1].recovery_stop_reason
    assert reason is not None and "CRC" in reason
    kept = [s.base_offset for s in log.segments]
    assert kept == [int(files[0].name[:20]), base]
    assert log.segments[-1].size == flip_at
    n_before = sum(1 for b in batches if b[0] < base) + len(positions) // 2
    assert _batches_of(log) == batches[:n_before]
    assert [p.name for p in _segment_files(d)] == [files[0].name, files[1].name]
    log.close()


def test_garbage_tail(tmp_path: Path) -> None:
    d, batches = _written_log(tmp_path)
    last = _segment_files(d)[-1]
    good = last.stat().st_size
    with open(last, "ab") as f:
        f.write(os.urandom(333))
    log = Log.open(d, CFG)
    assert log.segments[-1].size == good
    assert _batches_of(log) == batches
    assert log.load_result.truncated_bytes == 333
    log.close()


def test_zero_filled_tail(tmp_path: Path) -> None:
    d, batches = _written_log(tmp_path)
    last = _segment_files(d)[-1]
    good = last.stat().st_size
    os.truncate(last, good + 4096)  # a preallocated / sparse tail after power loss
    log = Log.open(d, CFG)
    assert log.segments[-1].size == good and _batches_of(log) == batches
    log.close()


def _reference_indexes(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    src = tmp_path / "ref" / "t-0"
    log = Log.open(src, CFG)
    for i in range(60):
        log.append(_batch(i))
    log.close()
    return src, {p.name: p.read_bytes() for p in src.iterdir() if "index" in p.name}


def test_index_file_deleted_is_rebuilt_even_after_clean_shutdown(tmp_path: Path) -> None:
    src, reference = _reference_indexes(tmp_path)
    victim = sorted(src.glob("*.index"))[0]
    victim.unlink()
    log = Log.open(src, CFG, clean_shutdown=True)
    assert int(victim.name[:20]) in log.load_result.recovered_segments
    log.close()
    assert victim.read_bytes() == reference[victim.name]


def test_index_file_with_garbage_is_rebuilt(tmp_path: Path) -> None:
    src, reference = _reference_indexes(tmp_path)
    victim = sorted(src.glob("*.index"))[1]
    victim.write_bytes(os.urandom(len(reference[victim.name]) or 64))
    tvictim = sorted(src.glob("*.timeindex"))[0]
    tvictim.write_bytes(os.urandom(120))
    log = Log.open(src, CFG, clean_shutdown=True)
    assert int(victim.name[:20]) in log.load_result.recovered_segments
    assert int(tvictim.name[:20]) in log.load_result.recovered_segments
    log.close()
    assert victim.read_bytes() == reference[victim.name]
    assert tvictim.read_bytes() == reference[tvictim.name]


def test_untrimmed_preallocated_index_after_crash(tmp_path: Path) -> None:
    d, batches = _written_log(tmp_path)
    active_index = sorted(d.glob("*.index"))[-1]
    assert active_index.stat().st_size == CFG.segment_index_bytes  # never trimmed
    log = Log.open(d, CFG)
    active = log.segments[-1]
    assert active.offset_index.entries() == [
        e for e in active.offset_index.entries() if e.offset < log.log_end_offset
    ]
    assert len(active.offset_index) < active.offset_index.max_entries
    assert active.offset_index.lookup(batches[-1][0]).offset <= batches[-1][0]
    assert _batches_of(log) == batches
    log.close()
    src_index = tmp_path / "src" / "t-0" / active_index.name
    assert active_index.read_bytes() == src_index.read_bytes()


def _reference_batches(src: Path) -> list[tuple[int, int]]:
    log = Log.open(src, CFG, clean_shutdown=True)
    try:
        return _batches_of(log)
    finally:
        log.close()


def test_deleted_leftovers_are_removed(tmp_path: Path) -> None:
    src, _ = _reference_indexes(tmp_path)
    before = _reference_batches(src)
    first_base = int(sorted(src.glob("*.log"))[0].name[:20])
    # a retired segment waiting for file.delete.delay.ms when the process stopped, and one
    # whose base offset collides with a live segment
    for base in (999_999, first_base):
        for suffix in (".log.deleted", ".index.deleted", ".timeindex.deleted"):
            segment_path(src, base, suffix).write_bytes(b"old")
    log = Log.open(src, CFG, clean_shutdown=True)
    assert len(log.load_result.deleted_files) == 6
    assert all(n.endswith(".deleted") for n in log.load_result.deleted_files)
    assert not list(src.glob("*.deleted"))
    assert _batches_of(log) == before
    log.close()


def test_cleaned_leftovers_and_their_swaps_are_removed(tmp_path: Path) -> None:
    src, _ = _reference_indexes(tmp_path)
    before = _reference_batches(src)
    first = sorted(src.glob("*.log"))[0]
    for suffix in (".log.cleaned", ".index.cleaned", ".timeindex.cleaned"):
        segment_path(src, 5, suffix).write_bytes(b"half-cleaned")
    # a .swap at or above the smallest .cleaned offset belongs to the same unfinished pass
    segment_path(src, 7, ".log.swap").write_bytes(first.read_bytes())
    segment_path(src, 7, ".index.swap").write_bytes(b"")
    log = Log.open(src, CFG, clean_shutdown=True)
    assert sorted(log.load_result.deleted_files) == [
        "00000000000000000005.index.cleaned",
        "00000000000000000005.log.cleaned",
        "00000000000000000005.timeindex.cleaned",
        "00000000000000000007.index.swap",
        "00000000000000000007.log.swap",
    ]
    assert log.load_result.swapped_segments == []
    assert not [p for p in src.iterdir() if p.name.endswith((".cleaned", ".swap"))]
    assert _batches_of(log) == before
    log.close()


def test_stray_index_without_log_is_removed(tmp_path: Path) -> None:
    src, _ = _reference_indexes(tmp_path)
    segment_path(src, 424242, ".index").write_bytes(b"\x00" * 16)
    segment_path(src, 424242, ".timeindex").write_bytes(b"")
    log = Log.open(src, CFG, clean_shutdown=True)
    assert sorted(log.load_result.deleted_files) == [
        "00000000000000424242.index",
        "00000000000000424242.timeindex",
    ]
    assert 424242 not in [s.base_offset for s in log.segments]
    log.close()


def test_swap_file_is_swapped_in(tmp_path: Path) -> None:
    src, _ = _reference_indexes(tmp_path)
    files = sorted(src.glob("*.log"))
    first, second = files[0], files[1]
    first_base, second_base = int(first.name[:20]), int(second.name[:20])
    # a "cleaned" replacement for the first two segments: only every other batch survives
    kept = bytearray()
    for f in (first, second):
        data = f.read_bytes()
        for i, (pos, h) in enumerate(iter_batches(data)):
            if i % 2 == 0:
                kept += data[pos : pos + h.size]
    segment_path(src, first_base, ".log.swap").write_bytes(kept)
    log = Log.open(src, CFG, clean_shutdown=True)
    assert log.load_result.swapped_segments == [first_base]
    bases = [s.base_offset for s in log.segments]
    assert first_base in bases and second_base not in bases
    assert log.segments[0].path.read_bytes() == bytes(kept)
    assert not list(src.glob("*.swap"))
    assert (src / first.name.replace(".log", ".index")).exists()
    fs = log.read(2, 100)
    assert fs.first_offset == 4  # offset 2 was cleaned away: the next batch
    log.close()


def test_segments_before_recovery_point_are_trusted(tmp_path: Path) -> None:
    d, _ = _written_log(tmp_path)
    files = _segment_files(d)
    last_base = int(files[-1].name[:20])
    log = Log.open(d, CFG, recovery_point=last_base)
    assert log.load_result.recovered_segments == [last_base]
    assert log.recovery_point == last_base
    log.close()


def test_clean_shutdown_skips_recovery(tmp_path: Path) -> None:
    src, _ = _reference_indexes(tmp_path)
    log = Log.open(src, CFG, clean_shutdown=True)
    assert log.load_result.recovered_segments == []
    assert log.recovery_point == log.log_end_offset
    log.close()
    log = Log.open(src, CFG, clean_shutdown=False)
    assert log.load_result.recovered_segments == [s.base_offset for s in log.segments]
    log.close()
