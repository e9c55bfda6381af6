"""The compiled record selection of the log rewrite against the rewrite's own Python loop:
the same batches byte for byte, on random batches of every codec; damaged record sections
raise the project's error."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.errors import CorruptRecordError
from logstore.protocol.batch import HEADER_SIZE, Codec, read_header
from logstore.protocol.records import build_batch
from logstore.storage.cleaner import _filter_batch
from pipelines.compaction._select import make_selector


@settings(max_examples=60, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=20)),
            st.one_of(st.none(), st.binary(max_size=300)),
            st.lists(
                st.tuples(st.text(max_size=3), st.one_of(st.none(), st.binary(max_size=4))),
                max_size=2,
            ),
            st.integers(-1000, 10**6),
        ),
        min_size=1,
        max_size=40,
    ),
    codec=st.sampled_from([Codec.NONE, Codec.GZIP, Codec.LZ4, Codec.ZSTD, Codec.SNAPPY]),
    base=st.integers(0, 2**40),
    data=st.data(),
)
def test_compiled_selection_equals_the_python_loop(records, codec, base, data) -> None:
    batch = build_batch(records, codec=codec, base_offset=base)
    header = read_header(batch)
    offsets = list(range(base, base + len(records)))
    keep = sorted(data.draw(st.sets(st.sampled_from(offsets), min_size=1)))
    # winners of other batches around this one must not matter
    others = [base - 3, base - 1, base + len(records), base + len(records) + 9]
    winners = sorted({o for o in keep + others if o >= 0})
    view = memoryview(batch)
    python, n1 = _filter_batch(view, header, keep=winners, drop_tombstones=False, horizon=None)
    compiled, n2 = _filter_batch(
        view,
        header,
        keep=winners,
        drop_tombstones=False,
        horizon=None,
        select=make_selector(np.array(winners, np.int64)),
    )
    assert (n1, n2) == (len(keep), len(keep))
    assert bytes(compiled) == bytes(python)


def test_damaged_sections_raise() -> None:
    batch = build_batch([(b"k%d" % i, b"v" * 30) for i in range(5)])
    section = bytes(batch[HEADER_SIZE:])
    select = make_selector(np.arange(5, dtype=np.int64))
    assert select(section, 0, 5)[1] == 5
    with pytest.raises(CorruptRecordError, match="out of bounds"):
        select(section[:-3], 0, 5)  # the last record cut short
    with pytest.raises(CorruptRecordError, match="left after"):
        select(section + b"\x00", 0, 5)
    with pytest.raises(CorruptRecordError, match="varint"):
        select(b"\xff" * 20, 0, 1)


@settings(max_examples=80, deadline=None)
@given(
    keys=st.lists(st.one_of(st.none(), st.sampled_from([b"", b"a", b"b", b"c\x00"])), max_size=60)
)
def test_last_per_key_is_the_general_rule_for_offsets(keys) -> None:
    """The offset strategy's shortcut picks what plan.winner_indices picks."""
    import pyarrow as pa

    from pipelines.compaction.log import _last_per_key
    from pipelines.compaction.model import Strategy
    from pipelines.compaction.plan import versions, winner_indices

    n = len(keys)
    table = pa.table(
        {
            "partition": pa.array(np.zeros(n, np.int32)),
            "key": pa.array(keys, pa.binary()),
            "offset": pa.array(np.arange(n, dtype=np.int64) * 3 + 5),
            "timestamp": pa.array(np.zeros(n, np.int64)),
            "headers": pa.array(
                [[]] * n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
            ),
        }
    )
    general = winner_indices(table, versions(table, Strategy()))
    assert sorted(_last_per_key(table).tolist()) == sorted(general.tolist())


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(0, 20000),
    distinct=st.integers(1, 5000),
)
def test_compiled_key_map_is_a_dict(seed, rows, distinct) -> None:
    """The compiled key map (one part or several of 8K rows, keys of up to 16 bytes compared
    in the slot, longer ones byte for byte) against a Python dict of each key's last row."""
    import pyarrow as pa

    from pipelines.compaction._select import last_per_key
    from pipelines.compaction.log import _key_buffers

    rng = np.random.default_rng(seed)
    space = [rng.bytes(int(rng.integers(0, 20))) for _ in range(distinct)]
    keys = [
        None if rng.random() < 0.05 else space[int(rng.integers(distinct))] for _ in range(rows)
    ]
    arr = pa.chunked_array(
        [pa.array(keys[: rows // 2], pa.binary()), pa.array(keys[rows // 2 :], pa.binary())]
    )
    offsets, data, valid = _key_buffers(arr)
    last: dict[bytes, int] = {}
    for i, k in enumerate(keys):
        if k is not None:
            last[k] = i
    assert np.flatnonzero(last_per_key(offsets[:-1], offsets[1:], data, valid)).tolist() == sorted(
        last.values()
    )


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(
        st.lists(
            st.tuples(
                st.one_of(st.none(), st.sampled_from([b"", b"a", b"b", b"key-long-than-16-bytes"])),
                st.one_of(st.none(), st.binary(max_size=30)),
            ),
            min_size=1,
            max_size=30,
        ),
        min_size=1,
        max_size=12,
    ),
    codec=st.sampled_from([Codec.NONE, Codec.LZ4]),
    segment_bytes=st.sampled_from([300, 2000, 1 << 20]),
)
def test_winning_offsets_equal_the_model(tmp_path_factory, batches, codec, segment_bytes):
    """On real segment files (several segments, both codecs): the winners of the vectorised
    decoder + compiled key map are the reference model's, tombstones included; keyless
    records never win."""
    from logstore.storage.cleaner import iter_segment_records, scan_segment
    from logstore.storage.config import LogConfig
    from logstore.storage.log import Log
    from pipelines.compaction.log import winners, winning_offsets
    from pipelines.compaction.model import DEFAULT_STRATEGY, Rec

    d = tmp_path_factory.mktemp("log") / "t-0"
    log = Log.open(d, LogConfig.from_properties({"segment.bytes": str(segment_bytes)}))
    for recs in batches:
        log.append(build_batch([(k, v, [], 1_700_000_000_000) for k, v in recs], codec=codec))
    log.roll()
    log.close()
    refs = [scan_segment(p)[0] for p in sorted(d.glob("*.log"))]
    keep, dead = winning_offsets(d, refs, DEFAULT_STRATEGY)
    recs = [
        Rec(0, r.offset, r.timestamp, r.key, r.value)
        for r in iter_segment_records(d, refs)
        if r.key is not None
    ]
    expected = sorted(winners(recs))
    assert keep.tolist() == expected
    by_offset = {r.offset: r for r in recs}
    assert dead.tolist() == [o for o in expected if by_offset[o].value is None]
