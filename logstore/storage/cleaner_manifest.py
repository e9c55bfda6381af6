"""The cleaner manifest: the file by which a cleaning job hands its ``.cleaned`` segments to
whoever owns the log dir (:mod:`logstore.storage.swap` applies it; the loader reads it to
finish a committed swap after a crash).

Format: ``<partition dir>/cleaner-manifest.json``, JSON ``{"version": 1, "topic",
"partition", "checkpoint_offset", "groups": [{"base_offset", "size", "replaced": [SegmentRef
...]}]}``; written to ``.tmp``, fsynced, renamed, directory fsynced, so a reader sees the
whole manifest or none. A malformed manifest raises :class:`~logstore.errors.LoglakeError`
naming the file.

Why a module of its own: the loader (called by ``Log.open``) needs the manifest and the swap
needs the log; with the manifest inside the swap module, loader -> swap -> log -> loader was
an import cycle. This module imports neither.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from logstore.errors import LoglakeError
from logstore.storage.cleaner import SegmentRef
from logstore.storage.files import fsync_dir, write_atomically

__all__ = [
    "MANIFEST_FILE",
    "CleanerManifest",
    "ManifestGroup",
    "manifest_end_offset",
    "read_manifest",
    "remove_manifest",
    "write_manifest",
]

_log = logging.getLogger(__name__)
MANIFEST_FILE = "cleaner-manifest.json"


@dataclass(frozen=True, slots=True)
class ManifestGroup:
    base_offset: int
    size: int  # of the .log.cleaned
    replaced: tuple[SegmentRef, ...]

    @property
    def end_offset(self) -> int:
        return self.replaced[-1].next_offset


@dataclass(frozen=True, slots=True)
class CleanerManifest:
    topic: str
    partition: int
    groups: tuple[ManifestGroup, ...]
    checkpoint_offset: int

    def to_json(self) -> dict[str, object]:
        return {
            "version": 1,
            "topic": self.topic,
            "partition": self.partition,
            "checkpoint_offset": self.checkpoint_offset,
            "groups": [
                {
                    "base_offset": g.base_offset,
                    "size": g.size,
                    "replaced": [r.to_json() for r in g.replaced],
                }
                for g in self.groups
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object], where: str) -> CleanerManifest:
        try:
            if data.get("version") != 1:
                raise ValueError(f"version {data.get('version')!r}, expected 1")
            groups = []
            for g in data["groups"]:  # type: ignore[attr-defined]
                replaced = tuple(SegmentRef.from_json(r) for r in g["replaced"])
                if not replaced or replaced[0].base_offset != int(g["base_offset"]):
                    raise ValueError("a group must start at its first replaced segment")
                groups.append(ManifestGroup(int(g["base_offset"]), int(g["size"]), replaced))
            return cls(
                str(data["topic"]),
                int(data["partition"]),  # type: ignore[call-overload]
                tuple(groups),
                int(data["checkpoint_offset"]),  # type: ignore[call-overload]
            )
        except (KeyError, TypeError, ValueError, LoglakeError) as exc:
            raise LoglakeError(f"bad cleaner manifest: {exc}", path=where) from None


def write_manifest(dir: str | os.PathLike[str], manifest: CleanerManifest) -> Path:
    """Write ``<dir>/cleaner-manifest.json`` atomically and durably."""
    path = Path(dir) / MANIFEST_FILE
    write_atomically(path, json.dumps(manifest.to_json(), indent=1).encode())
    return path


def read_manifest(dir: str | os.PathLike[str]) -> CleanerManifest | None:
    """The manifest of a partition directory; None when there is none."""
    path = Path(dir) / MANIFEST_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise LoglakeError(f"cleaner manifest is not JSON: {exc}", path=str(path)) from None
    if not isinstance(data, dict):
        raise LoglakeError("cleaner manifest is not a JSON object", path=str(path))
    return CleanerManifest.from_json(data, str(path))


def remove_manifest(dir: str | os.PathLike[str]) -> None:
    root = Path(dir)
    (root / (MANIFEST_FILE + ".tmp")).unlink(missing_ok=True)
    try:
        (root / MANIFEST_FILE).unlink()
    except FileNotFoundError:
        return
    fsync_dir(root)


def manifest_end_offset(dir: str | os.PathLike[str], base_offset: int) -> int | None:
    """For the loader: the end of the range the group starting at ``base_offset`` replaces,
    if a readable manifest names one; None otherwise."""
    try:
        manifest = read_manifest(dir)
    except LoglakeError as exc:
        _log.warning("%s", exc)
        return None
    if manifest is None:
        return None
    for g in manifest.groups:
        if g.base_offset == base_offset:
            return g.end_offset
    return None
