"""Index lookups equal a bisect reference, for any sorted entries and any target."""

from __future__ import annotations

import bisect
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.storage.index import OffsetIndex, OffsetPosition, TimeIndex, TimestampOffset

_SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def offset_entries(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]]]:
    base = draw(st.integers(0, 2**40))
    gaps = draw(st.lists(st.integers(1, 5000), max_size=2500))
    steps = draw(st.lists(st.integers(1, 100_000), min_size=len(gaps), max_size=len(gaps)))
    entries = []
    off, pos = base, 0
    for gap, step in zip(gaps, steps, strict=True):
        off += gap
        pos += step
        if pos >= 2**31 or off - base >= 2**31:
            break
        entries.append((off, pos))
    return base, entries


@_SETTINGS
@given(offset_entries(), st.lists(st.integers(-10, 2**41), max_size=50), st.data())
def test_offset_lookup_is_floor(
    data: tuple[int, list[tuple[int, int]]], randoms: list[int], draw: st.DataObject
) -> None:
    base, entries = data
    with tempfile.TemporaryDirectory() as tmp:
        idx = OffsetIndex(Path(tmp) / "i.index", base, max_index_size=8 * (len(entries) + 1))
        for off, pos in entries:
            idx.append(off, pos)
        keys = [o for o, _ in entries]
        targets = [*randoms, base - 1, base]
        if entries:
            targets += [draw.draw(st.integers(keys[0] - 3, keys[-1] + 3)) for _ in range(30)]
            targets += [keys[-1], keys[0]]
        for t in targets:
            i = bisect.bisect_right(keys, t) - 1
            want = OffsetPosition(base, 0) if i < 0 else OffsetPosition(*entries[i])
            assert idx.lookup(t) == want
        cut = draw.draw(st.integers(base, (keys[-1] + 2) if keys else base + 2))
        idx.truncate_to(cut)
        assert idx.entries() == [OffsetPosition(o, p) for o, p in entries if o < cut]
        idx.close()


@_SETTINGS
@given(
    st.lists(st.tuples(st.integers(1, 10**6), st.integers(0, 50)), max_size=2000),
    st.lists(st.integers(-(2**62), 2**62), max_size=40),
    st.data(),
)
def test_time_lookup_is_floor(
    steps: list[tuple[int, int]], randoms: list[int], draw: st.DataObject
) -> None:
    ts, off = draw.draw(st.integers(-1, 2**45)), 0
    entries = []
    for dts, doff in steps:
        ts += dts
        off += doff
        entries.append((ts, off))
    with tempfile.TemporaryDirectory() as tmp:
        idx = TimeIndex(Path(tmp) / "t.timeindex", 0, max_index_size=12 * (len(entries) + 2))
        for t, o in entries:
            idx.maybe_append(t, o)
        keys = [t for t, _ in entries]
        targets = list(randoms)
        if keys:
            targets += [draw.draw(st.integers(keys[0] - 3, keys[-1] + 3)) for _ in range(30)]
        for target in targets:
            i = bisect.bisect_right(keys, target) - 1
            want = TimestampOffset(-1, 0) if i < 0 else TimestampOffset(*entries[i])
            assert idx.lookup(target) == want
        idx.close()
