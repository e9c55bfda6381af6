"""Names on disk: topics, partition directories and segment files, as Kafka spells them.

Layout of one log directory (``log.dirs`` entry)::

    <log_dir>/.lock                                  flock held by the owning process
    <log_dir>/.kafka_cleanshutdown                   present only after a clean shutdown
    <log_dir>/recovery-point-offset-checkpoint       see :mod:`logstore.storage.checkpoints`
    <log_dir>/replication-offset-checkpoint
    <log_dir>/log-start-offset-checkpoint
    <log_dir>/topic-configs/<topic>.properties       see :mod:`logstore.storage.topic_config`
    <log_dir>/<topic>-<partition>/
        00000000000000000000.log                     record batches, base offset in the name
        00000000000000000000.index                   offset index (8-byte entries)
        00000000000000000000.timeindex               time index (12-byte entries)
        00000000000000000000.txnindex                aborted transactions (34-byte entries),
                                                     only once one aborted in the segment
        00000000000000000042.snapshot                producer state at offset 42 (Kafka's v1)
        leader-epoch-checkpoint

Segment files are named by their base offset zero-padded to 20 digits. The temporary suffixes
``.deleted`` (waiting for ``file.delete.delay.ms``), ``.cleaned`` (cleaner output not yet
swapped in) and ``.swap`` (cleaner output being swapped in) are appended to a full file name,
e.g. ``00000000000000000000.log.deleted``.

Security invariant: every path built here from a topic name (which arrives from the network)
lies inside the log directory. :func:`validate_topic` applies Kafka's rules, which already
exclude ``/``, ``\\``, NUL, ``.`` and ``..``; :func:`partition_dir` still resolves the result and
checks containment, so a symlinked or otherwise surprising name cannot escape either.

All functions are pure apart from :func:`partition_dir`'s ``resolve`` and the two that write
(:func:`fsync_dir`, :func:`write_atomically`), and are thread-safe.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
from pathlib import Path

from logstore.errors import InvalidTopicError

__all__ = [
    "CLEANED_SUFFIX",
    "CLEAN_SHUTDOWN_FILE",
    "DELETED_SUFFIX",
    "INDEX_SUFFIX",
    "LEADER_EPOCH_CHECKPOINT",
    "LOCK_FILE",
    "LOG_START_OFFSET_CHECKPOINT",
    "LOG_SUFFIX",
    "MAX_TOPIC_LENGTH",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "SNAPSHOT_SUFFIX",
    "SWAP_SUFFIX",
    "TIME_INDEX_SUFFIX",
    "TXN_INDEX_SUFFIX",
    "fsync_dir",
    "offset_from_file_name",
    "parse_partition_dir",
    "partition_dir",
    "partition_dir_name",
    "reserve_blocks",
    "segment_file_name",
    "segment_path",
    "validate_topic",
    "write_atomically",
]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"

# Kafka's Topic.MAX_NAME_LENGTH: 255 minus room for "-<partition>" and Kafka's ".<uuid>-delete"
# suffix of a partition directory being deleted.
MAX_TOPIC_LENGTH = 249
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")
# "<topic>-<partition>": the partition is the digits after the LAST dash (topics may hold dashes).
_PARTITION_DIR_RE = re.compile(r"(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>0|[1-9][0-9]{0,9})")
_SEGMENT_NAME_RE = re.compile(r"(?P<offset>[0-9]{20})(?P<suffix>\..+)")
_MAX_PARTITION = 2**31 - 1
_MAX_OFFSET = 2**63 - 1


def validate_topic(name: str) -> str:
    """Return ``name`` when Kafka would accept it as a topic name; raise otherwise.

    Kafka's rules (``org.apache.kafka.common.internals.Topic.validate``): 1..249 characters,
    each in ``[a-zA-Z0-9._-]``, and not ``.`` or ``..``. Raises :class:`InvalidTopicError`.
    """
    if not isinstance(name, str):
        raise InvalidTopicError(f"topic name must be a string, got {type(name).__name__}")
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_LENGTH:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long, at most {MAX_TOPIC_LENGTH} allowed"
        )
    if _TOPIC_RE.fullmatch(name) is None:
        raise InvalidTopicError(f"topic name {name!r} holds characters outside [a-zA-Z0-9._-]")
    return name


def _validate_partition(partition: int) -> int:
    if isinstance(partition, bool) or not isinstance(partition, int):
        raise InvalidTopicError(f"partition must be an int, got {type(partition).__name__}")
    if not 0 <= partition <= _MAX_PARTITION:
        raise InvalidTopicError(f"partition {partition} outside 0..{_MAX_PARTITION}")
    return partition


def partition_dir_name(topic: str, partition: int) -> str:
    """``"<topic>-<partition>"`` after validating both."""
    return f"{validate_topic(topic)}-{_validate_partition(partition)}"


def partition_dir(log_dir: str | os.PathLike[str], topic: str, partition: int) -> Path:
    """The directory of ``topic``-``partition`` under ``log_dir``; guaranteed inside it.

    Validates the topic and partition, then resolves both paths (following symlinks) and
    raises :class:`InvalidTopicError` if the result would not be a direct child of the
    resolved ``log_dir``. The directory is not created.
    """
    root = Path(log_dir).resolve()
    candidate = (root / partition_dir_name(topic, partition)).resolve()
    if candidate.parent != root:
        raise InvalidTopicError(
            f"partition directory for topic {topic!r} resolves outside the log directory",
            path=str(candidate),
        )
    return candidate


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` from a directory name like ``orders-3``; ``None`` if it is not one.

    Kafka's deletion (``-delete``), future (``-future``) and stray (``-stray``) directories and
    anything else that is not exactly ``<valid topic>-<partition>`` give ``None``.
    """
    m = _PARTITION_DIR_RE.fullmatch(name)
    if m is None:
        return None
    topic = m.group("topic")
    partition = int(m.group("partition"))
    if topic in (".", "..") or len(topic) > MAX_TOPIC_LENGTH or partition > _MAX_PARTITION:
        return None
    return topic, partition


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``"%020d%s" % (base_offset, suffix)``, e.g. ``00000000000000000042.log``."""
    if isinstance(base_offset, bool) or not isinstance(base_offset, int):
        raise TypeError(f"base_offset must be an int, got {type(base_offset).__name__}")
    if not 0 <= base_offset <= _MAX_OFFSET:
        raise ValueError(f"base offset {base_offset} outside 0..2**63-1")
    if not suffix.startswith(".") or "/" in suffix or "\\" in suffix or "\0" in suffix:
        raise ValueError(f"bad segment file suffix {suffix!r}")
    return f"{base_offset:020d}{suffix}"


def segment_path(dir: str | os.PathLike[str], base_offset: int, suffix: str) -> Path:
    """``dir / segment_file_name(base_offset, suffix)``."""
    return Path(dir) / segment_file_name(base_offset, suffix)


def offset_from_file_name(name: str) -> tuple[int, str] | None:
    """``(base_offset, suffix)`` of a segment-style file name, ``None`` for other files.

    ``00000000000000000042.log.deleted`` gives ``(42, ".log.deleted")``.
    """
    m = _SEGMENT_NAME_RE.fullmatch(name)
    if m is None:
        return None
    return int(m.group("offset")), m.group("suffix")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that creates, renames and deletes in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace ``path`` with ``data`` whole or not at all: write ``<name>.tmp`` beside it,
    fsync it, rename it over ``path``, then (``sync_dir``) fsync the directory so the rename
    is durable. After a crash either the old or the new file is there, never a mix.

    ``OSError`` when the disk refuses; the old file stays and the ``.tmp`` is removed then
    (a failure of the final directory fsync leaves the new file in place).
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


# Linux fallocate(2): mode FALLOC_FL_KEEP_SIZE reserves blocks without changing the file size
# (os.posix_fallocate has no modes)
_KEEP_SIZE = 0x01
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_FALLOCATE = getattr(_LIBC, "fallocate", None)
if _FALLOCATE is not None:
    _FALLOCATE.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    _FALLOCATE.restype = ctypes.c_int


def reserve_blocks(fd: int, offset: int, length: int) -> None:
    """Reserve disk blocks for ``[offset, offset + length)`` of ``fd`` without changing its
    size (``fallocate(FALLOC_FL_KEEP_SIZE)``); ``ftruncate`` to the size frees what is left.
    :class:`OSError` on failure (``ENOSYS`` where the C library has no ``fallocate``,
    ``EOPNOTSUPP`` on a filesystem without it, ``ENOSPC`` on a full disk)."""
    if _FALLOCATE is None:
        raise OSError(errno.ENOSYS, "fallocate is not available")
    if _FALLOCATE(fd, _KEEP_SIZE, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
