"""``loglake dump-log``: print the batches, records and index entries of Kafka segment files.

Like Kafka's ``kafka-dump-log.sh`` (``kafka.tools.DumpLogSegments``)::

    loglake dump-log --files F [F ...] [--print-data-log] [--index-sanity-check] [--json]
                     [--offsets-decoder | --transaction-log-decoder]

The kind of file comes from its suffix (a trailing ``.deleted``, ``.cleaned`` or ``.swap`` is
ignored): ``.log`` (record batches), ``.index`` (8-byte entries: relative offset i32, position
i32), ``.timeindex`` (12-byte entries: timestamp i64, relative offset i32), ``.txnindex``
(34-byte aborted-transaction entries), ``.snapshot`` (producer state snapshots, Kafka's
version 1: :mod:`logstore.storage.producer_snapshot`). The base offset comes from the
20-digit file name.

``--offsets-decoder`` / ``--transaction-log-decoder`` (each implies ``--print-data-log``)
print the keys and values of ``__consumer_offsets`` / ``__transaction_state`` records as
Kafka's tool does (:mod:`logstore.tools.internal_records`); with ``--json`` each record gets
``decoded_key`` and ``decoded_payload`` (those strings) beside its raw key and value.

Output, ``--json``: one JSON object per line.

* ``.log``: one object per batch with ``file, position, base_offset, last_offset, count, magic,
  codec, crc, crc_valid, is_control, is_transactional, producer_id, producer_epoch,
  base_sequence, partition_leader_epoch, max_timestamp``; with ``--print-data-log`` also
  ``records``: a list of ``{offset, timestamp, key, value, headers}`` (key and value base64 or
  null, headers ``[key, base64-or-null]`` pairs; ``records`` is null when they cannot be
  decoded).
* ``.index``: ``{offset, position}`` per entry; ``.timeindex``: ``{timestamp, offset}``;
  ``.txnindex``: ``{version, producer_id, first_offset, last_offset, last_stable_offset}``.
* problems: ``{file, position, error}`` (the file is corrupt, torn or unreadable: exit code 1)
  or ``{file, position, warning}`` (worth knowing, not wrong: exit code unchanged).
* ``--index-sanity-check``: ``{file, sanity_check: "passed", entries}`` or error objects.
* ``.snapshot``: one object per producer ``{producer_id, producer_epoch, coordinator_epoch,
  current_txn_first_offset, last_timestamp, first_sequence, last_sequence, last_offset,
  offset_delta}``; text as Kafka's (``producerId: 7 producerEpoch: 0 coordinatorEpoch: -1
  currentTxnFirstOffset: OptionalLong.empty lastTimestamp: ... firstSequence: ...``). A torn
  or corrupt snapshot (size, version, CRC) is an error.

Without ``--json`` the text looks like Kafka's (``baseOffset: 0 lastOffset: 9 count: 10 ...``,
``| offset: 0 CreateTime: ...``, ``offset: 0 position: 0``); problems are lines starting with
``ERROR`` / ``WARNING``. Never a stack trace for bad bytes: every
:class:`~logstore.errors.LoglakeError` becomes an error line.

Index files are read here with ``struct`` (read-only: never through the broker's index classes,
which map files for writing and may resize them). As Kafka's tool does, reading stops at the
first all-zero entry after the first one (an index left preallocated and untrimmed by a crash).

Index checks. Always, when the sibling ``.log`` exists, each ``.index`` entry is compared with
the batch at its position as ``DumpLogSegments`` does: Kafka (3.x+, one entry per batch) maps a
batch's *last* offset to the batch's start position; an entry whose offset is not that batch's
last offset is reported as Kafka's "mismatch" (a warning: entries written by older brokers for a
multi-batch append carry the last offset of the whole append, and lookups stay correct). What
would make a lookup wrong is an error: a position that is not the start of a batch, a batch
there whose base offset is above the entry's offset, or an offset beyond the end of the log.
``.timeindex`` entries must name an offset inside the log, and are compared with the batch
holding that offset (its last offset and max timestamp; differences are warnings, as in Kafka).
``--index-sanity-check`` adds Kafka's ``sanityCheck`` rules and prints no entries: the file size
is a multiple of the entry size; ``.index`` offsets and positions strictly increase;
``.timeindex`` timestamps and offsets never decrease; no offset below the base offset.
"""

from __future__ import annotations

import argparse
import base64
import json
import mmap
import re
import struct
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from logstore.errors import LoglakeError
from logstore.protocol.batch import (
    BatchHeader,
    Buffer,
    Codec,
    TimestampType,
    compute_crc,
    iter_batches,
)
from logstore.protocol.control import ControlType, decode_control_record
from logstore.protocol.records import Record, decode_batch
from logstore.storage.producer_snapshot import decode_snapshot
from logstore.tools.internal_records import format_offsets_record, format_txn_record

# (key, value, offset) -> (key text, payload text or None), as Kafka's MessageParser
Decoder = Callable[[bytes | None, bytes | None, int], tuple[str, str | None]]

__all__ = ["add_arguments", "dump_file", "run"]

_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
_TXN_ENTRY = struct.Struct(">hqqqq")  # version, producerId, first, last, lastStableOffset
_TEMP_SUFFIXES = (".deleted", ".cleaned", ".swap")
_NAME = re.compile(r"^(\d{20})$")


EPILOG = (
    "Exit codes: 0 every file dumped (or checked) without an error (WARNING lines and files of"
    " an unknown kind do not count); 1 at least one ERROR: a file corrupt, torn, unreadable or"
    " failing --index-sanity-check; 2 bad arguments; 130 interrupted."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--files",
        nargs="+",
        required=True,
        metavar="F",
        help="segment files: .log, .index, .timeindex, .txnindex, .snapshot",
    )
    parser.add_argument(
        "--print-data-log",
        action="store_true",
        help="also print each record (offset, timestamp, key, value, headers)",
    )
    parser.add_argument(
        "--index-sanity-check",
        action="store_true",
        help="check index files (Kafka's sanity checks, plus the sibling .log) "
        "instead of listing their entries",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    decoders = parser.add_mutually_exclusive_group()
    decoders.add_argument(
        "--offsets-decoder",
        action="store_true",
        help="decode __consumer_offsets records (offset commits, group metadata) as JSON;"
        " implies --print-data-log",
    )
    decoders.add_argument(
        "--transaction-log-decoder",
        action="store_true",
        help="decode __transaction_state records as JSON; implies --print-data-log",
    )


def run(args: argparse.Namespace) -> int:
    out = _Output(sys.stdout, as_json=bool(args.json))
    decoder: Decoder | None = None
    if args.offsets_decoder:
        decoder = format_offsets_record
    elif args.transaction_log_decoder:
        decoder = format_txn_record
    for name in args.files:
        dump_file(
            name,
            out,
            print_data_log=bool(args.print_data_log) or decoder is not None,
            index_sanity_check=bool(args.index_sanity_check),
            decoder=decoder,
        )
    sys.stdout.flush()
    return 1 if out.failed else 0


@dataclass
class _Output:
    """Writes objects as JSON lines or Kafka-style text; remembers whether anything failed."""

    stream: TextIO
    as_json: bool
    errors: int = 0

    @property
    def failed(self) -> bool:
        return self.errors > 0

    def obj(self, obj: dict[str, Any], text: str) -> None:
        self.stream.write(json.dumps(obj) + "\n" if self.as_json else text + "\n")

    def text(self, line: str) -> None:
        if not self.as_json:
            self.stream.write(line + "\n")

    def error(self, file: str, position: int | None, reason: str) -> None:
        self.errors += 1
        where = "" if position is None else f" at position {position}"
        self.obj(
            {"file": file, "position": position, "error": reason},
            f"ERROR: {file}{where}: {reason}",
        )

    def warning(self, file: str, position: int | None, reason: str) -> None:
        where = "" if position is None else f" at position {position}"
        self.obj(
            {"file": file, "position": position, "warning": reason},
            f"WARNING: {file}{where}: {reason}",
        )


def dump_file(
    name: str,
    out: _Output,
    *,
    print_data_log: bool = False,
    index_sanity_check: bool = False,
    decoder: Decoder | None = None,
) -> None:
    """Dump one file to ``out``; problems become error/warning objects, never exceptions."""
    path = Path(name)
    stem, kind = _split_name(path.name)
    base_offset = _base_offset(stem)
    out.text(f"Dumping {name}")
    if kind not in (".log", ".index", ".timeindex", ".txnindex", ".snapshot"):
        out.warning(name, None, f"ignoring unknown file (suffix {kind or 'none'!r})")
        return
    try:
        with _mapped(path) as data:
            if kind == ".log":  # dumped in every mode, as Kafka's tool does
                out.text(f"Log starting offset: {base_offset if base_offset is not None else '?'}")
                _dump_log(
                    name, data, base_offset, out, print_data_log=print_data_log, decoder=decoder
                )
                return
            if kind == ".snapshot":
                _dump_snapshot(name, data, out)
                return
            if base_offset is None:
                out.error(name, None, f"index file name {path.name!r} has no 20-digit base offset")
                return
            log = _sibling_log(path, stem, name, out)
            if kind == ".index":
                _dump_offset_index(name, data, base_offset, log, out, sanity=index_sanity_check)
            elif kind == ".timeindex":
                _dump_time_index(name, data, base_offset, log, out, sanity=index_sanity_check)
            else:
                _dump_txn_index(name, data, out, sanity=index_sanity_check)
    except OSError as exc:
        out.error(name, None, f"cannot read: {exc.strerror or exc}")


def _split_name(file_name: str) -> tuple[str, str]:
    for temp in _TEMP_SUFFIXES:
        if file_name.endswith(temp):
            file_name = file_name[: -len(temp)]
            break
    dot = file_name.find(".")
    if dot < 0:
        return file_name, ""
    return file_name[:dot], file_name[dot:]


def _base_offset(stem: str) -> int | None:
    match = _NAME.match(stem)
    return int(match.group(1)) if match else None


@contextmanager
def _mapped(path: Path) -> Iterator[Buffer]:
    """A file's bytes, read-only: an mmap (``b""`` for an empty file, which cannot be mapped)."""
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            yield b""
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data


# -- .log -------------------------------------------------------------------------------------


@dataclass
class _LogBatch:
    position: int
    header: BatchHeader


@dataclass
class _LogScan:
    """Batch headers of a sibling .log, for index checks."""

    batches: list[_LogBatch] = field(default_factory=list)
    error: str | None = None

    def at_position(self, position: int) -> _LogBatch | None:
        lo, hi = 0, len(self.batches)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.batches[mid].position < position:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.batches) and self.batches[lo].position == position:
            return self.batches[lo]
        return None

    def holding(self, offset: int) -> _LogBatch | None:
        """The first batch whose last offset is >= ``offset`` (Kafka's search)."""
        lo, hi = 0, len(self.batches)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.batches[mid].header.last_offset < offset:
                lo = mid + 1
            else:
                hi = mid
        return self.batches[lo] if lo < len(self.batches) else None


def _dump_log(
    name: str,
    data: Buffer,
    base_offset: int | None,
    out: _Output,
    *,
    print_data_log: bool,
    decoder: Decoder | None,
) -> None:
    previous: BatchHeader | None = None
    try:
        for position, header in iter_batches(data):
            if previous is None and base_offset is not None and header.base_offset < base_offset:
                out.warning(
                    name,
                    position,
                    f"file name says base offset {base_offset}, but the first batch starts at "
                    f"offset {header.base_offset}",
                )
            if previous is not None and header.base_offset <= previous.last_offset:
                out.warning(
                    name,
                    position,
                    f"base offset {header.base_offset} does not follow the previous batch's "
                    f"last offset {previous.last_offset}",
                )
            previous = header
            _dump_batch(
                name, data, position, header, out, print_data_log=print_data_log, decoder=decoder
            )
    except LoglakeError as exc:
        end = len(data) - (exc.position or 0)
        out.error(name, exc.position, f"{exc.message} ({end} bytes from here to the end)")


def _dump_batch(
    name: str,
    data: Buffer,
    position: int,
    header: BatchHeader,
    out: _Output,
    *,
    print_data_log: bool,
    decoder: Decoder | None,
) -> None:
    crc_valid = compute_crc(data, position, header.size) == header.crc
    codec_id = header.codec_id
    codec = Codec(codec_id).label if codec_id <= Codec.ZSTD else f"unknown({codec_id})"
    obj: dict[str, Any] = {
        "file": name,
        "position": position,
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "count": header.records_count,
        "magic": header.magic,
        "codec": codec,
        "crc": header.crc,
        "crc_valid": crc_valid,
        "is_control": header.is_control,
        "is_transactional": header.is_transactional,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "partition_leader_epoch": header.partition_leader_epoch,
        "max_timestamp": header.max_timestamp,
    }
    records: list[Record] | None = None
    problem: str | None = (
        None
        if crc_valid
        else "CRC mismatch: "
        + (f"stored {header.crc:#010x}, computed {compute_crc(data, position, header.size):#010x}")
    )
    if print_data_log:
        try:
            _, records = decode_batch(data, position, verify_crc=False)
        except LoglakeError as exc:
            problem = exc.message if problem is None else f"{problem}; {exc.message}"
        obj["records"] = (
            None
            if records is None
            else [_record_json(r, None if header.is_control else decoder) for r in records]
        )
    out.obj(obj, _batch_text(header, position, codec, crc_valid))
    if records is not None and not out.as_json:
        for record in records:
            out.text(_record_text(header, record, decoder))
    if problem is not None:
        out.error(name, position, problem)


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _record_json(record: Record, decoder: Decoder | None) -> dict[str, Any]:
    obj = {
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": _b64(record.key),
        "value": _b64(record.value),
        "headers": [[key, _b64(value)] for key, value in record.headers],
    }
    if decoder is not None:
        obj["decoded_key"], obj["decoded_payload"] = decoder(
            record.key, record.value, record.offset
        )
    return obj


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def _ts_label(header: BatchHeader) -> str:
    if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
        return "LogAppendTime"
    return "CreateTime"


def _batch_text(header: BatchHeader, position: int, codec: str, crc_valid: bool) -> str:
    horizon = header.delete_horizon_ms
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
        f"count: {header.records_count} baseSequence: {header.base_sequence} "
        f"lastSequence: {header.last_sequence} producerId: {header.producer_id} "
        f"producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {_bool(header.is_transactional)} "
        f"isControl: {_bool(header.is_control)} "
        f"deleteHorizonMs: {'OptionalLong.empty' if horizon is None else horizon} "
        f"position: {position} {_ts_label(header)}: {header.max_timestamp} "
        f"size: {header.size} magic: {header.magic} compresscodec: {codec} "
        f"crc: {header.crc} isvalid: {_bool(crc_valid)}"
    )


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _record_text(header: BatchHeader, record: Record, decoder: Decoder | None = None) -> str:
    sequence = -1
    if header.base_sequence >= 0:
        sequence = (header.base_sequence + record.offset - header.base_offset) & 0x7FFFFFFF
    line = (
        f"| offset: {record.offset} {_ts_label(header)}: {record.timestamp} "
        f"keySize: {-1 if record.key is None else len(record.key)} "
        f"valueSize: {-1 if record.value is None else len(record.value)} "
        f"sequence: {sequence} headerKeys: [{','.join(k for k, _ in record.headers)}]"
    )
    if header.is_control:
        try:
            control = decode_control_record(record.key, record.value)
        except LoglakeError as exc:
            return line + f" control record: {exc.message}"
        if control.coordinator_epoch is not None:
            kind = ControlType(control.type).name
            return line + f" endTxnMarker: {kind} coordinatorEpoch: {control.coordinator_epoch}"
        label = control.type.name if isinstance(control.type, ControlType) else "UNKNOWN"
        return line + f" controlType: {label}({int(control.type)})"
    if decoder is not None:
        key, payload = decoder(record.key, record.value, record.offset)
        return line + f" key: {key}" + ("" if payload is None else f" payload: {payload}")
    if record.key is not None:
        line += f" key: {_text(record.key)}"
    if record.value is not None:
        line += f" payload: {_text(record.value)}"
    return line


def _dump_snapshot(name: str, data: Buffer, out: _Output) -> None:
    try:
        entries = decode_snapshot(bytes(data), path=name)
    except LoglakeError as exc:
        out.error(name, None, exc.message)
        return
    for e in entries:
        first_seq = -1 if e.last_sequence < 0 else (e.last_sequence - e.offset_delta) & 0x7FFFFFFF
        txn = e.current_txn_first_offset
        obj = {
            "file": name,
            "producer_id": e.producer_id,
            "producer_epoch": e.epoch,
            "coordinator_epoch": e.coordinator_epoch,
            "current_txn_first_offset": None if txn < 0 else txn,
            "last_timestamp": e.timestamp,
            "first_sequence": first_seq,
            "last_sequence": e.last_sequence,
            "last_offset": e.last_offset,
            "offset_delta": e.offset_delta,
        }
        text = (
            f"producerId: {e.producer_id} producerEpoch: {e.epoch} "
            f"coordinatorEpoch: {e.coordinator_epoch} currentTxnFirstOffset: "
            f"{'OptionalLong.empty' if txn < 0 else f'OptionalLong[{txn}]'} "
            f"lastTimestamp: {e.timestamp}"
        )
        if e.last_offset >= 0:  # Kafka prints the batch metadata of a producer that wrote one
            text += (
                f" firstSequence: {first_seq} lastSequence: {e.last_sequence} "
                f"lastOffset: {e.last_offset} offsetDelta: {e.offset_delta} "
                f"timestamp: {e.timestamp}"
            )
        out.obj(obj, text)


# -- indexes ----------------------------------------------------------------------------------


def _sibling_log(path: Path, stem: str, name: str, out: _Output) -> _LogScan | None:
    log_path = path.with_name(stem + ".log")
    if not log_path.is_file():
        return None
    scan = _LogScan()
    try:
        with _mapped(log_path) as data:
            for position, header in iter_batches(data, allow_torn_tail=True):
                scan.batches.append(_LogBatch(position, header))
    except LoglakeError as exc:
        scan.error = f"{log_path.name} is corrupt at position {exc.position}: {exc.message}"
    except OSError as exc:
        scan.error = f"cannot read {log_path.name}: {exc.strerror or exc}"
    if scan.error is not None:
        out.warning(name, None, f"checked only against the readable part of the log: {scan.error}")
    return scan


def _entries(
    name: str, data: Buffer, entry: struct.Struct, out: _Output, *, sanity: bool
) -> Iterator[tuple[int, tuple[Any, ...]]]:
    """(slot, fields) up to the first all-zero entry after the first; checks the size."""
    size = len(data)
    whole = size - size % entry.size
    if size % entry.size:
        reason = f"size {size} is not a multiple of the entry size {entry.size}"
        if sanity:
            out.error(name, whole, reason)
        else:
            out.warning(name, whole, reason + f"; ignoring the last {size % entry.size} bytes")
    zero = bytes(entry.size)
    for slot in range(whole // entry.size):
        pos = slot * entry.size
        if slot > 0 and data[pos : pos + entry.size] == zero:
            if data[pos:whole] != bytes(whole - pos):
                out.warning(
                    name, pos, f"zero entry at slot {slot} followed by non-zero bytes; stopping"
                )
            else:
                out.warning(
                    name,
                    pos,
                    f"{(whole - pos) // entry.size} zero entries after {slot} entries "
                    "(preallocated, not trimmed: the broker did not shut down cleanly)",
                )
            return
        yield slot, entry.unpack_from(data, pos)


def _dump_offset_index(
    name: str,
    data: Buffer,
    base_offset: int,
    log: _LogScan | None,
    out: _Output,
    *,
    sanity: bool,
) -> None:
    errors_before = out.errors
    count = 0
    last_offset = last_position = -1
    log_end = log.batches[-1].header.last_offset if log and log.batches else None
    for slot, (relative, position) in _entries(name, data, _OFFSET_ENTRY, out, sanity=sanity):
        count += 1
        offset = base_offset + relative
        at = slot * _OFFSET_ENTRY.size
        if sanity and relative < 0:
            out.error(name, at, f"entry {slot}: offset {offset} below the base offset")
        if sanity and slot > 0 and (offset <= last_offset or position <= last_position):
            out.error(
                name,
                at,
                f"entry {slot} (offset {offset}, position {position}) does not follow "
                f"(offset {last_offset}, position {last_position})",
            )
        last_offset, last_position = offset, position
        if not sanity:
            out.obj(
                {"offset": offset, "position": position}, f"offset: {offset} position: {position}"
            )
        if log is not None:
            _check_offset_entry(
                name,
                at,
                slot=slot,
                offset=offset,
                position=position,
                log=log,
                log_end=log_end,
                out=out,
            )
    _sanity_result(name, out, sanity=sanity, errors_before=errors_before, count=count)


def _check_offset_entry(
    name: str,
    at: int,
    *,
    slot: int,
    offset: int,
    position: int,
    log: _LogScan,
    log_end: int | None,
    out: _Output,
) -> None:
    batch = log.at_position(position)
    if batch is None:
        if log.error is None or (log.batches and position < log.batches[-1].position):
            out.error(name, at, f"entry {slot}: position {position} is not the start of a batch")
        return
    if log_end is not None and offset > log_end and log.error is None:
        out.error(name, at, f"entry {slot}: offset {offset} beyond the log's last offset {log_end}")
    elif batch.header.base_offset > offset:
        out.error(
            name,
            at,
            f"entry {slot}: offset {offset} points at a batch starting at offset "
            f"{batch.header.base_offset}",
        )
    elif batch.header.last_offset != offset:
        out.warning(
            name,
            at,
            f"mismatch: index offset {offset}, log offset {batch.header.last_offset} "
            "(the batch at that position ends at another offset)",
        )


def _dump_time_index(
    name: str,
    data: Buffer,
    base_offset: int,
    log: _LogScan | None,
    out: _Output,
    *,
    sanity: bool,
) -> None:
    errors_before = out.errors
    count = 0
    last_timestamp: int | None = None
    last_offset = -1
    for slot, (timestamp, relative) in _entries(name, data, _TIME_ENTRY, out, sanity=sanity):
        count += 1
        offset = base_offset + relative
        at = slot * _TIME_ENTRY.size
        if sanity and relative < 0:
            out.error(name, at, f"entry {slot}: offset {offset} below the base offset")
        if (
            sanity
            and last_timestamp is not None
            and (timestamp < last_timestamp or offset < last_offset)
        ):
            out.error(
                name,
                at,
                f"entry {slot} (timestamp {timestamp}, offset {offset}) goes back from "
                f"(timestamp {last_timestamp}, offset {last_offset})",
            )
        last_timestamp, last_offset = timestamp, offset
        if not sanity:
            out.obj(
                {"timestamp": timestamp, "offset": offset},
                f"timestamp: {timestamp} offset: {offset}",
            )
        if log is not None:
            batch = log.holding(offset)
            if batch is None:
                if log.error is None:
                    out.error(name, at, f"entry {slot}: offset {offset} is not in the log")
            elif batch.header.base_offset > offset:
                out.error(name, at, f"entry {slot}: offset {offset} is in no batch (a gap)")
            elif batch.header.last_offset != offset:
                out.warning(
                    name,
                    at,
                    f"entry {slot}: offset {offset} is not the last offset of its batch "
                    f"({batch.header.last_offset})",
                )
            elif batch.header.max_timestamp != timestamp:
                out.warning(
                    name,
                    at,
                    f"entry {slot}: timestamp {timestamp} but the batch's max timestamp is "
                    f"{batch.header.max_timestamp}",
                )
    _sanity_result(name, out, sanity=sanity, errors_before=errors_before, count=count)


def _dump_txn_index(name: str, data: Buffer, out: _Output, *, sanity: bool) -> None:
    errors_before = out.errors
    count = 0
    size = len(data)
    if size % _TXN_ENTRY.size:
        out.error(
            name,
            size - size % _TXN_ENTRY.size,
            f"size {size} is not a multiple of the entry size {_TXN_ENTRY.size}",
        )
    for slot in range(size // _TXN_ENTRY.size):
        version, producer_id, first, last, lso = _TXN_ENTRY.unpack_from(
            data, slot * _TXN_ENTRY.size
        )
        count += 1
        if not sanity:
            out.obj(
                {
                    "version": version,
                    "producer_id": producer_id,
                    "first_offset": first,
                    "last_offset": last,
                    "last_stable_offset": lso,
                },
                f"version: {version} producerId: {producer_id} firstOffset: {first} "
                f"lastOffset: {last} lastStableOffset: {lso}",
            )
    _sanity_result(name, out, sanity=sanity, errors_before=errors_before, count=count)


def _sanity_result(
    name: str, out: _Output, *, sanity: bool, errors_before: int, count: int
) -> None:
    if not sanity:
        if count == 0:
            out.text(f"{name} is empty.")
        return
    if out.errors > errors_before:
        return
    out.obj(
        {"file": name, "sanity_check": "passed", "entries": count},
        f"{name} passed sanity check.",
    )
