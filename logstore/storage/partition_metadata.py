"""``partition.metadata``: the topic id a partition directory belongs to (Kafka's
``PartitionMetadataFile``, KIP-516).

Format (text, exactly what Kafka writes)::

    version: 0
    topic_id: <id>

``<id>`` is Kafka's ``Uuid.toString()``: the 16 bytes in URL-safe base64 without padding
(22 characters). Version 0 is the only one; another version, a missing line or an id that
does not decode is refused with :class:`CorruptPartitionMetadataError` naming the file.

Why: a topic id must outlive restarts and must *not* outlive the topic. A client that keeps
an id (Fetch v13+, DeleteTopics by id) must never reach a new topic that happens to reuse the
name, so every topic gets a random id at creation (:func:`new_topic_id`) stored in each of its
partition directories. Directories written by older loglake versions have no file: they are
given the id loglake used to derive from the name (:func:`legacy_topic_id`), so the ids
clients already hold stay valid.

Crash behaviour: the file is written with :func:`~logstore.storage.files.write_atomically`
before the partition's first segment, so after a crash it is either whole or absent (absent:
the legacy id is written at the next start). Pure functions over one file: thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from pathlib import Path
from typing import Final

from logstore.errors import LoglakeError
from logstore.storage.files import write_atomically

__all__ = [
    "LEGACY_TOPIC_ID_NAMESPACE",
    "PARTITION_METADATA_FILE",
    "CorruptPartitionMetadataError",
    "InconsistentTopicIdError",
    "format_topic_id",
    "legacy_topic_id",
    "new_topic_id",
    "parse_topic_id",
    "read_partition_metadata",
    "write_partition_metadata",
]

PARTITION_METADATA_FILE: Final = "partition.metadata"

# loglake before partition.metadata: uuid5(namespace, topic name)
LEGACY_TOPIC_ID_NAMESPACE: Final = uuid.UUID("6f1e3c4a-9b7d-4e52-8a61-0c3d5b2f7e90")

# Kafka reserves these two (Uuid.ZERO_UUID, Uuid.METADATA_TOPIC_ID): never handed out.
_RESERVED: Final = frozenset({uuid.UUID(int=0), uuid.UUID(int=1)})


class CorruptPartitionMetadataError(LoglakeError):
    """A ``partition.metadata`` file that is not version 0 with a valid topic id."""


class InconsistentTopicIdError(LoglakeError):
    """Two partition directories of one topic carry different topic ids (Kafka's
    ``InconsistentTopicIdException``): the log dirs mix two incarnations of the topic."""


def format_topic_id(topic_id: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode("ascii")


def parse_topic_id(text: str) -> uuid.UUID:
    """Kafka's ``Uuid.fromString``; ValueError unless ``text`` is 22 base64url characters."""
    if len(text) != 22:
        raise ValueError(f"a topic id has 22 characters, got {len(text)}: {text!r}")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {text!r}") from exc
    return uuid.UUID(bytes=raw)


def new_topic_id() -> uuid.UUID:
    """A random id as Kafka's ``Uuid.randomUuid()`` makes them: never a reserved id, and
    never one whose string starts with ``-`` (it would read as a command-line flag)."""
    while True:
        tid = uuid.uuid4()
        if tid not in _RESERVED and not format_topic_id(tid).startswith("-"):
            return tid


def legacy_topic_id(topic: str) -> uuid.UUID:
    """The id loglake derived from the name before it kept ``partition.metadata``."""
    return uuid.uuid5(LEGACY_TOPIC_ID_NAMESPACE, topic)


def read_partition_metadata(partition_dir: Path) -> uuid.UUID | None:
    """The topic id in ``partition_dir/partition.metadata``, None when there is no file."""
    path = partition_dir / PARTITION_METADATA_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptPartitionMetadataError("not UTF-8 text", path=str(path)) from exc
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise CorruptPartitionMetadataError(f"malformed line {line!r}", path=str(path))
        fields[key.strip()] = value.strip()
    if fields.get("version") != "0":
        raise CorruptPartitionMetadataError(
            f"expected version 0, got {fields.get('version')!r}", path=str(path)
        )
    if "topic_id" not in fields:
        raise CorruptPartitionMetadataError("no topic_id line", path=str(path))
    try:
        return parse_topic_id(fields["topic_id"])
    except ValueError as exc:
        raise CorruptPartitionMetadataError(f"bad topic_id: {exc}", path=str(path)) from exc


def write_partition_metadata(partition_dir: Path, topic_id: uuid.UUID) -> None:
    """Write ``partition.metadata`` atomically (and fsync the directory)."""
    data = f"version: 0\ntopic_id: {format_topic_id(topic_id)}".encode("ascii")
    write_atomically(partition_dir / PARTITION_METADATA_FILE, data)
