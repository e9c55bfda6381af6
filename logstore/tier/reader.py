"""Reads of remote segments (the broker's side): batches for Fetch, offsets by timestamp.

A remote segment is read through its ``.rsm-manifest`` (:mod:`logstore.tier.layout`): the
offset or time index from ``.indexes`` narrows the scan to a position in the segment file,
then only the ``.log`` chunks covering the bytes wanted are fetched with ranged GETs
(decompressed when the plugin's zstd compression wrote them). Manifests, index parts and
chunks (decompressed) go through one byte-bounded LRU (``rsm.config.fetch.chunk.cache.size``):
they are immutable, a segment id is never reused.

Every method waits for the store: call them on the tier's reader pool, never on a network
thread. Errors: the store's :class:`ObjectStoreError` (``ObjectNotFoundError`` for a missing
object), :class:`CorruptIndexError` for a manifest or chunk that does not parse,
:class:`StorageError` for segment bytes that do not parse. Thread-safe (the cache locks).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from logstore.errors import CorruptRecordError, StorageError
from logstore.objectstore import ObjectStore
from logstore.protocol.batch import BatchHeader, iter_batches
from logstore.protocol.records import first_record_at_time
from logstore.storage.txn_index import TxnSearchResult, collect_aborted, decode_entries
from logstore.tier import layout
from logstore.tier.metadata import RemoteSegment

__all__ = ["ChunkCache", "SegmentReader"]

T = TypeVar("T")
READ_AHEAD = 64 * 1024


class ChunkCache:
    """A byte-bounded LRU of immutable remote bytes (chunks, manifests, index parts)."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._size = 0
        self._items: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...], load: Callable[[], T], size: Callable[[T], int]) -> T:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                self.hits += 1
                return self._items[key][0]  # type: ignore[no-any-return]
        value = load()
        n = size(value)
        with self._lock:
            self.misses += 1
            if n <= self._max and key not in self._items:
                self._items[key] = (value, n)
                self._size += n
                while self._size > self._max:
                    _, (_, old) = self._items.popitem(last=False)
                    self._size -= old
        return value


class SegmentReader:
    """Reads remote segments of ``store`` under ``key_prefix`` through ``cache``."""

    def __init__(self, store: ObjectStore, cache: ChunkCache, *, key_prefix: str) -> None:
        self.store = store
        self.cache = cache
        self.key_prefix = key_prefix

    def manifest(self, seg: RemoteSegment) -> layout.Manifest:
        key = layout.segment_keys(self.key_prefix, seg)[layout.MANIFEST]
        return self.cache.get(
            ("manifest", seg.segment_id),
            lambda: layout.parse_manifest(
                self.store.read(key), path=self.store.uri(key), allow_compression=True
            ),
            lambda _m: 512,
        )

    def index_part(self, seg: RemoteSegment, manifest: layout.Manifest, name: str) -> bytes:
        """One index of the segment's ``.indexes`` (b"" when absent or empty)."""
        where = manifest.indexes.get(name)
        if where is None or where[1] == 0:
            return b""
        key = layout.segment_keys(self.key_prefix, seg)[layout.INDEXES]
        return self.cache.get(
            (name, seg.segment_id),
            lambda: self.store.read_range(key, offset=where[0], length=where[1]),
            len,
        )

    def _chunk(self, seg: RemoteSegment, manifest: layout.Manifest, i: int) -> bytes:
        key = layout.segment_keys(self.key_prefix, seg)[layout.LOG]
        chunks = manifest.chunks
        start, length = chunks.chunk_range(i)

        def load() -> bytes:
            data = self.store.read_range(key, offset=start, length=length)
            if not manifest.compression:
                return data
            out = layout.decompress_chunk(data, max_size=chunks.chunk_size)
            if len(out) != chunks.original_range(i)[1]:
                raise StorageError(
                    f"{self.store.uri(key)}: chunk {i} decompresses to {len(out)} bytes,"
                    f" the manifest says {chunks.original_range(i)[1]}"
                )
            return out

        return self.cache.get(("chunk", seg.segment_id, i), load, len)

    def bytes_at(self, seg: RemoteSegment, manifest: layout.Manifest, pos: int, n: int) -> bytes:
        """Bytes ``[pos, pos + n)`` of the segment file (fewer at its end)."""
        chunks = manifest.chunks
        n = min(n, chunks.file_size - pos)
        if n <= 0:
            return b""
        wanted = chunks.chunks_for(pos, n)
        joined = b"".join(self._chunk(seg, manifest, i) for i in wanted)
        first = chunks.original_range(wanted[0])[0]
        return joined[pos - first : pos - first + n]

    def _batches(
        self, seg: RemoteSegment, manifest: layout.Manifest, position: int
    ) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """``(header, window, position in window)`` of each batch from ``position`` to the end
        of the segment, reading windows that grow when a batch is larger than one."""
        size = manifest.chunks.file_size
        want = READ_AHEAD
        while position < size:
            window = self.bytes_at(seg, manifest, position, want)
            end = 0
            with _parsing():
                for pos, header in iter_batches(window, allow_torn_tail=True):
                    end = pos + header.size
                    yield header, window, pos
            if end == 0:
                if position + len(window) >= size:
                    raise StorageError(
                        f"remote segment {seg.segment_id} ends in a torn batch at {position}"
                    )
                want *= 2
                continue
            position += end
            want = READ_AHEAD

    def read(
        self, seg: RemoteSegment, offset: int, max_bytes: int, *, max_offset: int
    ) -> tuple[bytes, int, int] | None:
        """Whole batches of ``seg`` from the one holding ``offset``: at least one, then
        while within ``max_bytes``, none starting at or above ``max_offset``; with the first
        and last offsets sent. None when none qualifies."""
        manifest = self.manifest(seg)
        index = self.index_part(seg, manifest, "offset")
        position = layout.floor_position(index, offset - seg.start_offset)
        want = max(max_bytes, READ_AHEAD)
        while True:
            data = self.bytes_at(seg, manifest, position, want)
            out = _select(data, offset, max_bytes, max_offset)
            if out is not None or position + len(data) >= manifest.chunks.file_size:
                return out
            want *= 2

    def aborted(self, seg: RemoteSegment, fetch_offset: int, upper_bound: int) -> TxnSearchResult:
        """Kafka's ``collectAbortedTxns`` over ``seg``'s transaction index: the aborted
        transactions whose ABORT marker is in ``seg`` at or after ``fetch_offset`` and whose
        first offset is below ``upper_bound``, and whether no later segment can hold one."""
        if seg.txn_index_empty:
            return TxnSearchResult([], False)
        txn = self.index_part(seg, self.manifest(seg), "transaction")
        return collect_aborted(
            decode_entries(txn, path=str(seg.segment_id)), fetch_offset, upper_bound
        )

    def offset_for_timestamp(
        self, seg: RemoteSegment, timestamp: int, *, start_offset: int
    ) -> tuple[int, int] | None:
        """Kafka's remote timestamp lookup in one segment: ``(offset, timestamp)`` of the
        first record at or above ``start_offset`` whose timestamp is >= ``timestamp``; None
        when the segment has none. The time index gives where to start (the greatest entry
        at or below the target: everything before it is older), the offset index its
        position; batches whose max timestamp is older are skipped undecoded."""
        return self._first_at_time(seg, timestamp, start_offset=start_offset, exact=False)

    def offset_of_max_timestamp(self, seg: RemoteSegment) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the record holding ``seg``'s largest timestamp (its
        metadata's ``max_timestamp_ms``): in the first batch whose max timestamp it is, that
        batch's first record carrying it (Kafka's ``RecordBatch.offsetOfMaxTimestamp``;
        under LogAppendTime every record carries it, so the batch's first). The time index
        gives where to start: its greatest entry at or below that timestamp is where the
        segment's running maximum last grew before it, so no earlier batch reaches it. None
        when no batch carries it (a segment without timestamps)."""
        target = seg.max_timestamp_ms
        if target < 0:
            return None
        return self._first_at_time(seg, target, start_offset=seg.start_offset, exact=True)

    def _first_at_time(
        self, seg: RemoteSegment, timestamp: int, *, start_offset: int, exact: bool
    ) -> tuple[int, int] | None:
        """The scan behind both lookups: from the time index's floor of ``timestamp`` (no
        earlier batch reaches it), the first batch at or above ``start_offset`` whose max
        timestamp reaches ``timestamp`` (equals it with ``exact``) and has a record that
        :func:`first_record_at_time` accepts; batches that cannot are skipped undecoded."""
        manifest = self.manifest(seg)
        relative = layout.time_floor(self.index_part(seg, manifest, "timestamp"), timestamp)
        first = max(seg.start_offset + relative, start_offset)
        index = self.index_part(seg, manifest, "offset")
        position = layout.floor_position(index, first - seg.start_offset)
        for header, window, pos in self._batches(seg, manifest, position):
            top = header.max_timestamp
            if header.last_offset < start_offset or (
                top != timestamp if exact else top < timestamp
            ):
                continue
            with _parsing():
                found = first_record_at_time(
                    window, pos, timestamp=timestamp, min_offset=start_offset, exact=exact
                )
            if found is not None:
                return found
        return None


@contextmanager
def _parsing() -> Iterator[None]:
    """Segment bytes that do not parse, as the :class:`StorageError` this module raises."""
    try:
        yield
    except CorruptRecordError as exc:
        raise StorageError(f"remote segment bytes do not parse: {exc}") from exc


def _select(
    data: bytes, offset: int, max_bytes: int, max_offset: int
) -> tuple[bytes, int, int] | None:
    """The whole batches of ``data`` from the one holding ``offset``: at least one, then while
    within ``max_bytes``, none starting at or above ``max_offset``; None when the first one is
    not whole in ``data``."""
    begin = end = -1
    first = last = -1
    with _parsing():
        for pos, header in iter_batches(data, allow_torn_tail=True):
            if header.last_offset < offset:
                continue
            if header.base_offset >= max_offset:
                break
            size = header.size
            if begin >= 0 and pos + size - begin > max_bytes:
                break
            if begin < 0:
                begin, first = pos, header.base_offset
            end, last = pos + size, header.last_offset
    if begin < 0:
        return None
    return data[begin:end], first, last
