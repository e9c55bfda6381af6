"""A segment's ``.txnindex``: the aborted transactions whose ABORT marker is in the segment.

Kafka's ``TransactionIndex``. Bytes on disk: a plain concatenation of 34-byte entries, no
header, big-endian::

    offset  size  field
         0     2  version            i16  0
         2     8  producerId         i64
        10     8  firstOffset        i64  the transaction's first offset in this partition
        18     8  lastOffset         i64  the ABORT marker's offset
        26     8  lastStableOffset   i64  the partition's last stable offset once it aborted

One entry is appended per ABORT marker (COMMIT markers leave no trace), in marker order, so
``lastOffset`` strictly increases through the file. The file is created with the first entry:
a segment without aborted transactions has no ``.txnindex``, as in Kafka.

What always holds: every entry is whole and of version 0; ``lastOffset`` increases and lies
in the segment. A file that breaks this fails :meth:`TransactionIndex.sanity_check` with
:class:`~logstore.errors.CorruptIndexError`; recovery then rebuilds it from the log.

Reads (:meth:`collect`) use the entries kept in memory (loaded once on open: the file is
small, one entry per aborted transaction), so a READ_COMMITTED fetch reads no file.

Thread-safety: one writer (the owning log's lock, or the partition's append lock for a
marker); readers see the entry list replaced, never mutated in place.

Crash behaviour: entries reach the file with ``write(2)`` after the marker reached the
``.log``, and are fsynced with the segment (:meth:`flush`). After a crash the file may lack
the last entries or hold a torn one; recovery of the segment rebuilds the whole file from the
markers in the log (:mod:`logstore.storage.producer_loader`).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Final, NamedTuple

from logstore.errors import CorruptIndexError, StorageError

__all__ = ["ENTRY_SIZE", "AbortedTxn", "TransactionIndex", "TxnSearchResult", "collect_aborted"]

_ENTRY = struct.Struct(
    ">"
    "h"  # version (0)
    "q"  # producerId
    "q"  # firstOffset
    "q"  # lastOffset: the ABORT marker
    "q"  # lastStableOffset after the abort
)
ENTRY_SIZE: Final = 34
VERSION: Final = 0


class AbortedTxn(NamedTuple):
    """One ``.txnindex`` entry (see the module docstring)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(
            VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


class TxnSearchResult(NamedTuple):
    """:meth:`TransactionIndex.collect`'s answer: the matching entries, and whether no later
    segment can hold one (an entry's last stable offset reached the upper bound)."""

    aborted: list[AbortedTxn]
    complete: bool


def collect_aborted(
    entries: Sequence[AbortedTxn], fetch_offset: int, upper_bound_offset: int
) -> TxnSearchResult:
    """Kafka's ``collectAbortedTxns`` over one segment's ``entries`` (in marker order): a
    local ``.txnindex`` (:meth:`TransactionIndex.collect`) or a remote segment's
    (``logstore.tier``), so that both answer alike."""
    out: list[AbortedTxn] = []
    # the entries whose marker lies below fetch_offset cannot match, nor end the search
    # (an LSO is at most its marker's offset + 1 <= fetch_offset < the bound): skip them
    # with one bisection (the markers' offsets increase) instead of walking a long index
    # from its start at every fetch
    i = bisect.bisect_left(entries, fetch_offset, key=_last_offset)
    for e in entries[i:] if i else entries:
        if e.first_offset < upper_bound_offset:
            out.append(e)
        if e.last_stable_offset >= upper_bound_offset:
            return TxnSearchResult(out, True)
    return TxnSearchResult(out, False)


def decode_entries(data: bytes | bytearray | memoryview, *, path: str = "") -> list[AbortedTxn]:
    """The entries of a ``.txnindex`` file's bytes; :class:`CorruptIndexError` for a torn
    entry or an unknown version."""
    if len(data) % ENTRY_SIZE:
        raise CorruptIndexError(
            f"transaction index of {len(data)} bytes is not a multiple of {ENTRY_SIZE}",
            path=path,
        )
    out: list[AbortedTxn] = []
    for pos in range(0, len(data), ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != VERSION:
            raise CorruptIndexError(
                f"transaction index entry of version {version}, expected {VERSION}",
                path=path,
                position=pos,
            )
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def _last_offset(e: AbortedTxn) -> int:
    return e.last_offset


class TransactionIndex:
    """The ``.txnindex`` of one segment (see the module docstring)."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] = []
        self._load_error: CorruptIndexError | None = None
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        try:
            self._entries = decode_entries(data, path=str(path))
        except CorruptIndexError as exc:
            self._load_error = exc  # raised by sanity_check; recovery rebuilds the file

    @property
    def entries(self) -> Sequence[AbortedTxn]:
        return self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def sanity_check(self, next_offset: int | None = None) -> None:
        """:class:`CorruptIndexError` unless every entry is whole, of version 0, and the
        markers' offsets increase within ``[base_offset, next_offset)``."""
        if self._load_error is not None:
            raise self._load_error
        prev = self.base_offset - 1
        for i, e in enumerate(self._entries):
            if e.last_offset <= prev or (next_offset is not None and e.last_offset >= next_offset):
                raise CorruptIndexError(
                    f"aborted transaction with marker offset {e.last_offset} not above {prev}"
                    f" or outside the segment (next offset {next_offset})",
                    path=str(self.path),
                    position=i * ENTRY_SIZE,
                )
            prev = e.last_offset

    def append(self, txn: AbortedTxn) -> None:
        """Write one entry; :class:`ValueError` unless its marker follows the last one,
        :class:`StorageError` when the write fails (nothing is added then)."""
        if self._entries and txn.last_offset <= self._entries[-1].last_offset:
            raise ValueError(
                f"{self.path}: aborted transaction marker {txn.last_offset} does not follow"
                f" {self._entries[-1].last_offset}"
            )
        data = txn.encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                size = len(self._entries) * ENTRY_SIZE
                # the entries' end, not the file's: a torn entry of a crash is overwritten
                os.ftruncate(fd, size)
                os.pwrite(fd, data, size)
            finally:
                os.close(fd)
        except OSError as exc:
            raise StorageError(
                f"cannot append to the transaction index: {exc.strerror}",
                path=str(self.path),
                errno=exc.errno,
            ) from exc
        self._entries = [*self._entries, txn]

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> TxnSearchResult:
        """Kafka's ``collectAbortedTxns``: the aborted transactions overlapping
        ``[fetch_offset, upper_bound_offset)`` (marker at or after ``fetch_offset``, first
        offset below the bound); complete once an entry's last stable offset reaches the
        bound (every later abort then began at or after it)."""
        return collect_aborted(self._entries, fetch_offset, upper_bound_offset)

    def rewrite(self, entries: Sequence[AbortedTxn]) -> None:
        """Replace the whole file with ``entries`` (recovery; a tmp file renamed into
        place). No entries: the file is removed."""
        self._entries = list(entries)
        self._load_error = None
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_bytes(b"".join(e.encode() for e in entries))
            os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StorageError(
                f"cannot write the transaction index: {exc.strerror}",
                path=str(self.path),
                errno=exc.errno,
            ) from exc

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or above ``offset`` (log truncation)."""
        kept = [e for e in self._entries if e.last_offset < offset]
        if len(kept) != len(self._entries):
            self.rewrite(kept)

    def flush(self) -> None:
        """fsync the file (with the segment's ``.log``)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename_to(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
