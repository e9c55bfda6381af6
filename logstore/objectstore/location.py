"""Where a lake (or one of its tables) lives: a local directory or an object-store prefix.

Accepted forms::

    /data/lake, lake, file:///data/lake          local disk (made absolute)
    s3://bucket/prefix                           S3 and S3-compatible stores (MinIO, moto)
    gs://bucket/prefix                           Google Cloud Storage
    abfss://container@account.dfs.core.windows.net/prefix   Azure Data Lake Storage Gen2

A location is a value: parsing never touches the store. The key (the part after the bucket)
never holds ``..``, ``.`` or empty segments: an object store has no directories, so
``s3://b/a/../x`` would silently be another object than the one meant; such paths are refused
rather than normalised. Local paths are resolved lexically (``Path.absolute``) and refused the
same way, because a lake path comes from config files and command lines, not from users
browsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import urlsplit

from logstore.errors import InvalidConfigError

__all__ = ["REMOTE_SCHEMES", "LakeLocation", "Scheme", "check_relative"]

Scheme = Literal["file", "s3", "gs", "abfss"]
REMOTE_SCHEMES: tuple[Scheme, ...] = ("s3", "gs", "abfss")
_ALIASES: dict[str, Scheme] = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "abfss": "abfss"}


def check_relative(path: str, *, where: str) -> str:
    """``path`` (``a/b/c``, ``/`` separated) if it is a plain relative key below a location:
    no leading ``/``, no ``..`` / ``.`` / empty segments. Returned without a trailing ``/``."""
    text = path.strip("/") if path.endswith("/") else path
    if text.startswith("/") or "\\" in text:
        raise InvalidConfigError(f"{where}: {path!r} must be a relative path with '/' separators")
    parts = text.split("/") if text else []
    if any(p in ("", ".", "..") for p in parts):
        raise InvalidConfigError(
            f"{where}: {path!r} holds an empty, '.' or '..' segment; give the path plainly"
        )
    return text


@dataclass(frozen=True, slots=True)
class LakeLocation:
    """A parsed location. ``bucket`` is the bucket (container for ``abfss``; empty for local),
    ``key`` the prefix inside it without leading or trailing ``/`` (for local disk, the
    absolute directory path), ``authority`` the URI's host part (``container@account...``)."""

    scheme: Scheme
    bucket: str
    key: str
    authority: str = ""

    @classmethod
    def parse(cls, text: str | Path) -> LakeLocation:
        """Parse a location (see the module docstring); ``InvalidConfigError`` if it is none."""
        raw = str(text).strip()
        if not raw:
            raise InvalidConfigError("empty lake location")
        if isinstance(text, Path) or "://" not in raw:
            return cls._local(raw)
        parts = urlsplit(raw)
        scheme = parts.scheme.lower()
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise InvalidConfigError(f"file:// location with a host: {raw!r}")
            return cls._local(parts.path)
        if scheme not in _ALIASES:
            raise InvalidConfigError(
                f"unsupported lake location scheme {parts.scheme!r} in {raw!r}; "
                "use a local path, file://, s3://, gs:// or abfss://"
            )
        if parts.query or parts.fragment:
            raise InvalidConfigError(f"lake location {raw!r} must not have '?' or '#' parts")
        canonical = _ALIASES[scheme]
        authority = parts.netloc
        bucket = authority.split("@", 1)[0] if canonical == "abfss" else authority
        if not bucket or (canonical == "abfss" and "@" not in authority):
            want = "container@account.dfs.core.windows.net" if canonical == "abfss" else "bucket"
            raise InvalidConfigError(f"lake location {raw!r} names no {want}")
        key = check_relative(parts.path.lstrip("/"), where=f"lake location {raw!r}")
        return cls(canonical, bucket, key, authority)

    @classmethod
    def _local(cls, path: str) -> LakeLocation:
        if any(p == ".." for p in PurePosixPath(path).parts):
            raise InvalidConfigError(f"lake path {path!r} holds '..'; give the path plainly")
        return cls("file", "", str(Path(path).absolute()), "")

    @property
    def is_local(self) -> bool:
        """True for local disk (``file``), False for an object store."""
        return self.scheme == "file"

    @property
    def uri(self) -> str:
        """The form delta-rs and the rest of the lake take: a plain absolute path for local
        disk, ``scheme://authority/key`` otherwise."""
        if self.is_local:
            return self.key
        return f"{self.scheme}://{self.authority}" + (f"/{self.key}" if self.key else "")

    @property
    def fs_path(self) -> str:
        """The path pyarrow's filesystem of this scheme takes (``bucket/key``; local: absolute)."""
        if self.is_local:
            return self.key
        return f"{self.bucket}/{self.key}" if self.key else self.bucket

    @property
    def local_path(self) -> Path:
        """The directory on local disk; ``InvalidConfigError`` for an object-store location."""
        if not self.is_local:
            raise InvalidConfigError(f"{self.uri} is on an object store, not on local disk")
        return Path(self.key)

    def join(self, *parts: str) -> LakeLocation:
        """The location ``parts`` (relative keys, ``/`` separated) below this one."""
        rel = "/".join(check_relative(p, where=f"path below {self.uri}") for p in parts if p)
        if not rel:
            return self
        if self.is_local:
            return LakeLocation("file", "", str(Path(self.key) / rel), "")
        key = f"{self.key}/{rel}" if self.key else rel
        return LakeLocation(self.scheme, self.bucket, key, self.authority)

    def relative_to(self, other: LakeLocation) -> str:
        """This location's key below ``other`` (``InvalidConfigError`` if it is not below)."""
        same_root = (self.scheme, self.bucket, self.authority) == (
            other.scheme,
            other.bucket,
            other.authority,
        )
        base = other.key.rstrip("/")
        if same_root and (not base or self.key == base or self.key.startswith(base + "/")):
            return self.key[len(base) :].lstrip("/")
        raise InvalidConfigError(f"{self.uri} is not below {other.uri}")

    def __str__(self) -> str:
        return self.uri
