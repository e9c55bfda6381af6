"""The lake's object store: one interface over local disk and S3 (GCS/Azure by settings).

Paths given to :class:`ObjectStore` are keys relative to its root (``records/_delta_log/x``),
checked by :func:`~logstore.objectstore.location.check_relative` (no ``..``). Reads, writes,
listing and deletes go through the pyarrow filesystem of the location
(:meth:`StorageSettings.filesystem`); put-if-absent is an ``os.link`` of a fully written
temporary file on local disk (atomic, never a partly written object) and a ``PutObject`` with
``If-None-Match: *`` on S3 (:mod:`logstore.objectstore._s3put`, why it is not pyarrow there);
:meth:`ObjectStore.read_range_into` on S3 is a ranged GET of loglake's own into the caller's
buffer (:mod:`logstore.objectstore._s3get`, why there).

Failures:

- Throttling (503 SlowDown) and timeouts: pyarrow's AWS retry strategy retries each request
  (``max_attempts``); on top of that every operation is tried at most ``max_attempts`` times
  with exponential backoff (0.1 s doubling, capped at 2 s) when the error is transient
  (connection refused or reset, timeout, 5xx, throttling). Then
  :class:`~logstore.errors.ObjectStoreUnavailableError` names the operation and the object.
  A stopped server therefore ends in an error after a bounded time, never a hang.
- An object missing on read/size/ranged read: :class:`~logstore.errors.ObjectNotFoundError`
  with its URI (e.g. deleted by someone else between a listing and the read).
- Anything else: :class:`~logstore.errors.ObjectStoreError` with the store's message.

Writes are whole objects: S3 makes a PUT visible atomically; on local disk :meth:`write`
writes a temporary sibling and renames it over the target, so a crash leaves the old object or
the new one, plus possibly a ``.tmp-*`` file that a listing skips. Thread-safe: pyarrow
filesystems are, and the store keeps no other state.
"""

from __future__ import annotations

import builtins
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from logstore.errors import (
    ObjectNotFoundError,
    ObjectStoreError,
    ObjectStoreUnavailableError,
)
from logstore.objectstore._s3get import get_range_into_s3
from logstore.objectstore._s3put import (
    SINGLE_PUT_MAX_BYTES,
    TRANSIENT_STATUS,
    error_code,
    put_if_absent_s3,
    put_object_s3,
)
from logstore.objectstore.location import LakeLocation, check_relative
from logstore.objectstore.settings import StorageSettings

__all__ = ["ObjectInfo", "ObjectStore", "open_store"]

T = TypeVar("T")
_TMP_PREFIX = ".tmp-"
_COPY_CHUNK = 8 << 20  # bytes per read of write_file's source
# pyarrow / AWS SDK / curl wordings of errors worth another try
_TRANSIENT = re.compile(
    r"connect|timed? ?out|timeout|reset|refused|broken pipe|slow[ _]?down|throttl|"
    r"service unavailable|internal ?error|503|500|502|504|network|curlcode",
    re.IGNORECASE,
)
_MISSING = re.compile(r"no such key|not ?found|does not exist|nosuchkey|404", re.IGNORECASE)
_BACKOFF_S = 0.1
_BACKOFF_CAP_S = 2.0


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """One object from a listing: its key relative to the store's root, its size, and when it
    was last written (seconds since the epoch by the store's clock, as :meth:`ObjectStore.modified`;
    0.0 where the listing does not say)."""

    path: str
    size: int
    modified: float = 0.0


class ObjectStore:
    """Objects below ``root`` (see the module docstring for paths, failures, crash behaviour)."""

    def __init__(
        self,
        root: LakeLocation,
        *,
        settings: StorageSettings | None = None,
        unsigned_put_small: bool = False,
    ):
        """On S3 an object smaller than one part (10 MiB) is written with one PUT, larger
        ones as a multipart upload (:meth:`StorageSettings.filesystem`). With
        ``unsigned_put_small`` that PUT of :meth:`write` and :meth:`write_file` is loglake's
        own (:func:`~logstore.objectstore._s3put.put_object_s3`: an unsigned payload and a
        CRC32C checksum), not pyarrow's: the broker's tier uploads (why, in that module)."""
        self.root = root
        self._single_put = unsigned_put_small and root.scheme == "s3"
        self.settings = settings if settings is not None else StorageSettings.default()
        self.filesystem: pafs.FileSystem = self.settings.filesystem(root)

    def __repr__(self) -> str:
        return f"ObjectStore({self.root.uri!r})"

    # ---- naming ----

    def location(self, path: str) -> LakeLocation:
        """The location of key ``path`` below the root."""
        return self.root.join(check_relative(path, where=f"object key below {self.root.uri}"))

    def uri(self, path: str) -> str:
        """The full URI of key ``path`` (for messages and for delta-rs)."""
        return self.location(path).uri

    # ---- operations ----

    def read(self, path: str) -> bytes:
        """The whole object."""
        loc = self.location(path)

        def op() -> bytes:
            with self.filesystem.open_input_stream(loc.fs_path) as f:
                return bytes(f.read())

        return self._retry("read", loc, op)

    def read_range(self, path: str, *, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end of the object); one ranged GET on
        S3 (pyarrow's random-access file), a seek and read on disk."""
        if offset < 0 or length < 0:
            raise ObjectStoreError(
                f"ranged read needs offset >= 0 and length >= 0, got {offset}, {length}",
                path=self.uri(path),
            )
        loc = self.location(path)

        def op() -> bytes:
            with self.filesystem.open_input_file(loc.fs_path) as f:
                return bytes(f.read_at(length, offset)) if length else b""

        return self._retry("ranged read", loc, op)

    def read_range_into(self, path: str, *, offset: int, into: memoryview) -> int:
        """Bytes from ``offset`` into ``into`` (a writable, contiguous byte view: as many as
        it holds); how many were read, fewer at the end of the object. On S3 one ranged GET
        of loglake's own, its body read into ``into`` (:mod:`logstore.objectstore._s3get`:
        measured ~2.7x less client CPU than :meth:`read_range`, why there); on disk a
        ``preadv``; elsewhere (GCS, Azure) pyarrow's ranged read copied in. A retry writes
        ``into`` again. :meth:`read_range` stays pyarrow's on S3 (the tier bench measures its
        floor both ways)."""
        if offset < 0:
            raise ObjectStoreError(
                f"ranged read needs offset >= 0, got {offset}", path=self.uri(path)
            )
        loc = self.location(path)
        if not len(into):
            return 0
        if loc.is_local:

            def local() -> int:
                fd = os.open(loc.key, os.O_RDONLY)
                try:
                    got = 0
                    while got < len(into) and (n := os.preadv(fd, [into[got:]], offset + got)):
                        got += n
                    return got
                finally:
                    os.close(fd)

            return self._retry("ranged read", loc, local)
        if loc.scheme == "s3":
            return self._retry(
                "ranged read",
                loc,
                lambda: get_range_into_s3(
                    self.settings, loc.bucket, loc.key, offset=offset, into=into
                ),
            )

        def copied() -> int:
            with self.filesystem.open_input_file(loc.fs_path) as f:
                data = f.read_at(len(into), offset)
            into[: len(data)] = memoryview(data).cast("B")
            return len(data)

        return self._retry("ranged read", loc, copied)

    def write(self, path: str, data: bytes) -> None:
        """Write (or replace) the whole object."""
        loc = self.location(path)
        if loc.is_local:
            self._retry("write", loc, lambda: _write_local(Path(loc.key), data))
            return
        if self._single_put and len(data) < SINGLE_PUT_MAX_BYTES:
            self._retry("write", loc, lambda: self._put(loc, data))
            return

        def op() -> None:
            with self.filesystem.open_output_stream(loc.fs_path) as f:
                f.write(data)

        self._retry("write", loc, op)

    def write_file(self, path: str, source: str | os.PathLike[str]) -> int:
        """Write (or replace) the object from local file ``source``, streamed in chunks of
        :data:`_COPY_CHUNK` (a segment of a gigabyte is never whole in memory); its size.
        ``FileNotFoundError`` (not retried) when ``source`` is missing: an upload of a file
        that went is an error, never an empty object. On S3 a file larger than one part is
        a multipart upload: pyarrow's S3 output stream sends a part (10 MiB) each time its
        buffer fills (the first one starts the upload), from background threads, and
        completes the upload on close (checked on the tests' S3 server: a 25 MiB file is
        stored with a 3-part ETag, a file under one part with one PUT; with
        ``unsigned_put_small`` loglake's own PUT, the file read whole: it is under 10 MiB)."""
        loc = self.location(path)
        size = os.path.getsize(source)

        def op() -> None:
            if self._single_put and size < SINGLE_PUT_MAX_BYTES:
                with open(source, "rb") as src:
                    data = src.read()
                if len(data) != size:
                    raise ObjectStoreError(
                        f"{source} changed size during its upload ({size} -> {len(data)} bytes)",
                        path=loc.uri,
                    )
                self._put(loc, data)
                return
            with open(source, "rb") as src:
                if loc.is_local:
                    target = Path(loc.key)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    tmp = _tmp_sibling(target)
                    try:
                        with open(tmp, "wb") as out:
                            shutil.copyfileobj(src, out, _COPY_CHUNK)
                            out.flush()
                            os.fsync(out.fileno())
                        os.replace(tmp, target)
                    finally:
                        tmp.unlink(missing_ok=True)
                    return
                with self.filesystem.open_output_stream(loc.fs_path) as out:
                    while chunk := src.read(_COPY_CHUNK):
                        out.write(chunk)

        self._retry("write", loc, op)
        return size

    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Write the object only if no object has that key: True when this call wrote it,
        False when one was there already (its content untouched). Of concurrent callers on
        one key, exactly one gets True."""
        loc = self.location(path)
        if loc.is_local:
            return self._retry("put-if-absent", loc, lambda: _link_local(Path(loc.key), data))
        if loc.scheme != "s3":
            raise ObjectStoreError(
                f"put-if-absent is implemented for local disk and S3, not {loc.scheme}://",
                path=loc.uri,
            )

        def op() -> bool:
            status, body = put_if_absent_s3(self.settings, loc.bucket, loc.key, data)
            if status == 412:
                return False
            _check_put(status, body, loc, "conditional PUT")
            return True

        return self._retry("put-if-absent", loc, op)

    def _put(self, loc: LakeLocation, data: bytes) -> None:
        """One PUT of ``data`` at ``loc`` (S3, ``unsigned_put_small``)."""
        status, body = put_object_s3(
            self.settings, loc.bucket, loc.key, data, unsigned_payload=True
        )
        _check_put(status, body, loc, "PUT")

    def exists(self, path: str) -> bool:
        """Whether an object (or, on local disk, a directory) has this key."""
        loc = self.location(path)
        info = self._retry("exists", loc, lambda: self.filesystem.get_file_info(loc.fs_path))
        return bool(info.type != pafs.FileType.NotFound)

    def size(self, path: str) -> int:
        """The object's size in bytes."""
        loc = self.location(path)
        info = self._retry("size", loc, lambda: self.filesystem.get_file_info(loc.fs_path))
        if info.type != pafs.FileType.File:
            raise ObjectNotFoundError("no such object", path=loc.uri)
        return int(info.size or 0)

    def modified(self, path: str) -> float:
        """When the object was last written, in seconds since the epoch, by the *store's*
        clock (S3's ``Last-Modified``, whole seconds; the file system's mtime on disk).
        Comparing two such times needs no agreement between the clocks of the writers."""
        loc = self.location(path)
        info = self._retry("stat", loc, lambda: self.filesystem.get_file_info(loc.fs_path))
        if info.type != pafs.FileType.File or info.mtime_ns is None:
            raise ObjectNotFoundError("no such object", path=loc.uri)
        return int(info.mtime_ns) / 1e9

    def list(self, prefix: str = "", *, recursive: bool = True) -> list[ObjectInfo]:
        """Objects whose key lies below directory ``prefix`` (``""``: the whole root),
        sorted by key; directories (local disk) and temporary files of :meth:`write` are left
        out. An absent prefix lists as empty."""
        loc = self.location(prefix) if prefix else self.root
        selector = pafs.FileSelector(loc.fs_path, recursive=recursive, allow_not_found=True)
        infos = self._retry("list", loc, lambda: self.filesystem.get_file_info(selector))
        base = self.root.fs_path.rstrip("/")
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or info.base_name.startswith(_TMP_PREFIX):
                continue
            mtime = int(info.mtime_ns) / 1e9 if info.mtime_ns is not None else 0.0
            out.append(ObjectInfo(info.path[len(base) :].lstrip("/"), int(info.size or 0), mtime))
        return sorted(out, key=lambda o: o.path)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """The names of the "directories" right below ``prefix``: subdirectories on local disk,
        common prefixes (``prefix/<name>/...``) on an object store; sorted."""
        loc = self.location(prefix) if prefix else self.root
        selector = pafs.FileSelector(loc.fs_path, recursive=False, allow_not_found=True)
        infos = self._retry("list", loc, lambda: self.filesystem.get_file_info(selector))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def move(self, source: str, target: str) -> None:
        """Move object ``source`` to ``target`` (replacing it): a rename on local disk (atomic);
        a server-side copy then a delete of the source on an object store, which has no rename
        (not atomic: a crash between the two leaves both, the caller must be able to tell which
        one counts). ``ObjectNotFoundError`` if ``source`` is absent."""
        src, dst = self.location(source), self.location(target)
        if src.is_local:

            def rename() -> None:
                Path(dst.key).parent.mkdir(parents=True, exist_ok=True)
                os.replace(src.key, dst.key)

            self._retry("move", src, rename)
            return
        self._retry("copy", src, lambda: self.filesystem.copy_file(src.fs_path, dst.fs_path))
        self.delete(source, missing_ok=True)

    def delete(self, path: str, *, missing_ok: bool = False) -> None:
        """Delete the object (``ObjectNotFoundError`` if absent, unless ``missing_ok``)."""
        loc = self.location(path)

        def op() -> None:
            try:
                self.filesystem.delete_file(loc.fs_path)
            except FileNotFoundError:
                if not missing_ok:
                    raise

        self._retry("delete", loc, op)

    # ---- retries ----

    def _retry(self, what: str, loc: LakeLocation, op: Callable[[], T]) -> T:
        attempts = self.settings.max_attempts
        for attempt in range(1, attempts + 1):
            try:
                return op()
            except ObjectStoreError:
                raise
            except FileNotFoundError:
                raise ObjectNotFoundError(f"{what}: no such object", path=loc.uri) from None
            except (OSError, pa.ArrowException) as exc:
                text = str(exc)
                if _MISSING.search(text) and not _TRANSIENT.search(text):
                    raise ObjectNotFoundError(f"{what}: no such object", path=loc.uri) from None
                if not _TRANSIENT.search(text):
                    message = f"{what} failed: {_one_line(text)}"
                    raise ObjectStoreError(message, path=loc.uri) from exc
                if attempt == attempts:
                    raise ObjectStoreUnavailableError(
                        f"{what} failed after {attempts} attempts, the store is unreachable "
                        f"or throttling: {_one_line(text)}",
                        path=loc.uri,
                    ) from exc
                time.sleep(min(_BACKOFF_CAP_S, _BACKOFF_S * 2 ** (attempt - 1)))
        raise AssertionError("unreachable")  # pragma: no cover


def open_store(
    location: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> ObjectStore:
    """The store rooted at ``location`` (parsed when a string), settings from the environment
    unless given."""
    loc = location if isinstance(location, LakeLocation) else LakeLocation.parse(location)
    return ObjectStore(loc, settings=settings)


def _check_put(status: int, body: str, loc: LakeLocation, what: str) -> None:
    """A PUT's answer: 200 passes; a transient status is an ``OSError`` (retried by
    ``_retry``); any other an :class:`ObjectStoreError` with S3's code."""
    if status == 200:
        return
    if status in TRANSIENT_STATUS:
        raise OSError(f"HTTP {status} (transient): {error_code(body)}")
    raise ObjectStoreError(f"{what} refused: HTTP {status} {error_code(body)}", path=loc.uri)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]


def _tmp_sibling(target: Path) -> Path:
    return target.with_name(f"{_TMP_PREFIX}{target.name}.{uuid.uuid4().hex}")


@contextmanager
def _synced_tmp(target: Path, data: bytes) -> Iterator[Path]:
    """``data`` in a new temporary sibling of ``target`` (its directory made), fsynced: what
    a rename or a link then makes visible whole. Removed on the way out (after a rename,
    there is nothing left to remove)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _write_local(target: Path, data: bytes) -> None:
    with _synced_tmp(target, data) as tmp:
        os.replace(tmp, target)


def _link_local(target: Path, data: bytes) -> bool:
    """Put-if-absent on disk: the data is complete in a temporary file before ``link`` makes
    it visible under the target name, and ``link`` fails if the name exists (atomic). The
    directory is synced after a link, so a written object (a Delta commit) survives a power
    cut once this returns True."""
    with _synced_tmp(target, data) as tmp:
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True
