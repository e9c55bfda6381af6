"""``_match.KeyIndex`` against a dict: every probed row finds the indexed row with its
partition and key, and nothing else (null keys never match, masked rows are skipped)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.compaction._match import KeyIndex

_keys = st.one_of(st.none(), st.binary(max_size=20), st.sampled_from([b"", b"a", b"\x00" * 9]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), _keys), max_size=30),
    st.lists(st.tuples(st.integers(0, 2), _keys, st.booleans()), max_size=60),
    st.booleans(),
    st.integers(0, 5),
)
def test_locate_equals_a_dict(
    indexed: list[tuple[int, bytes | None]],
    probed: list[tuple[int, bytes | None, bool]],
    large: bool,
    base: int,
) -> None:
    indexed = list(dict.fromkeys(indexed))  # one row per (partition, key)
    index = KeyIndex(
        np.array([p for p, _ in indexed], dtype=np.int32),
        pa.array([k for _, k in indexed], pa.binary()),
    )
    # the probed rows: unique per (partition, key) as a bucket's live rows are; sliced, and
    # in chunks, as tables hand them over
    probed = list({(p, k): (p, k, m) for p, k, m in probed}.values())
    keys = pa.array(
        [b"pad", *(k for _, k, _ in probed)], pa.large_binary() if large else pa.binary()
    )
    keys = keys.slice(1)
    chunked = pa.chunked_array([keys.slice(0, len(probed) // 2), keys.slice(len(probed) // 2)])
    out = np.full(len(indexed), -1, dtype=np.int64)
    index.locate(
        np.array([p for p, _, _ in probed], dtype=np.int32),
        chunked,
        out,
        base=base,
        rows=np.array([m for _, _, m in probed], dtype=bool),
    )
    where = {(p, k): base + i for i, (p, k, m) in enumerate(probed) if m and k is not None}
    want = [where.get((p, k), -1) if k is not None else -1 for p, k in indexed]
    assert out.tolist() == want


def test_many_rows_few_keys() -> None:
    n = 200_000
    keys = pa.array([b"key-%08d" % i for i in range(n)], pa.binary())
    rng = np.random.default_rng(3)
    chosen = np.sort(rng.choice(n, 5_000, replace=False))
    part = (np.arange(n) % 3).astype(np.int32)
    index = KeyIndex(part[chosen], keys.take(pa.array(chosen)))
    out = np.full(len(chosen), -1, dtype=np.int64)
    index.locate(part, keys, out)
    assert out.tolist() == chosen.tolist()
    # the same keys in another partition match nothing
    out[:] = -1
    index.locate((part + 1) % 3, keys, out)
    assert (out == -1).all()
