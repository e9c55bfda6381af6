"""TransactionIndex.collect against Kafka's collectAbortedTxns loop, on random indexes."""

from __future__ import annotations

import random
from pathlib import Path

from logstore.storage.txn_index import AbortedTxn, TransactionIndex


def _kafka_collect(
    entries: list[AbortedTxn], fetch_offset: int, upper: int
) -> tuple[list[AbortedTxn], bool]:
    """Kafka's TransactionIndex.collectAbortedTxns, a walk from the first entry."""
    out = []
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper:
            out.append(e)
        if e.last_stable_offset >= upper:
            return out, True
    return out, False


def test_collect_skips_to_the_fetch_offset_and_answers_as_kafkas_walk(tmp_path: Path) -> None:
    rnd = random.Random(7)
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex", 0)
    entries: list[AbortedTxn] = []
    offset = 0
    open_since: list[int] = []
    for pid in range(300):
        first = offset + rnd.randrange(0, 5)
        marker = first + rnd.randrange(1, 40)
        open_since = [o for o in open_since if o > marker - 60]
        lso = min([*open_since, marker + 1])
        open_since.append(first)
        e = AbortedTxn(pid, first, marker, lso)
        idx.append(e)
        entries.append(e)
        offset = marker + 1
    for _ in range(2000):
        fetch = rnd.randrange(0, offset + 5)
        upper = fetch + rnd.randrange(1, 400)
        found = idx.collect(fetch, upper)
        assert (found.aborted, found.complete) == _kafka_collect(entries, fetch, upper)
