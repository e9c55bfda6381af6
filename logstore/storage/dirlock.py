"""The log directory's ``.lock``: one process per log directory, as in Kafka's ``FileLock``.

``<log_dir>/.lock`` is an empty file held with ``flock(LOCK_EX | LOCK_NB)`` for as long as the
owning :class:`~logstore.storage.log_manager.LogManager` runs. The kernel drops the lock when the
process dies, so a crash never leaves a stale lock behind; the file itself is left in place.
A second holder — another process, or another open in this one — gets
:class:`~logstore.errors.LogDirLockedError`. Thread-safe.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from logstore.errors import LogDirLockedError
from logstore.storage.files import LOCK_FILE

__all__ = ["DirLock"]


class DirLock:
    """An exclusive, non-blocking flock on ``<log_dir>/.lock``."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.path = Path(log_dir) / LOCK_FILE
        self._fd: int | None = None

    @property
    def locked(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`LogDirLockedError` at once."""
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise LogDirLockedError(
                "log directory is in use by another process (or another LogManager)",
                path=str(self.path),
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
