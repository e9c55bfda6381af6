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
    rows=st.integers(0, 6000),
    distinct=st.integers(1, 5000),
)
def test_compiled_key_map_is_a_dict(seed, rows, distinct) -> None:
    """The compiled key map (hash table grown past its first size, keys compared byte for
    byte) against a Python dict of each key's last row."""
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
    assert np.flatnonzero(last_per_key(offsets, data, valid)).tolist() == sorted(last.values())
