"""How to reach the object store: settings from the standard AWS environment, overridable.

Sources, later wins:

1. The environment: ``AWS_ENDPOINT_URL`` (an ``http://`` endpoint is used as such, no TLS:
   delta-rs's ``AWS_ALLOW_HTTP`` and pyarrow's ``scheme="http"`` follow from it),
   ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``
   (else ``AWS_DEFAULT_REGION``, else ``us-east-1``).
2. An optional mapping, the ``[storage]`` section of ``conf/pipeline.toml`` (see
   :data:`OVERRIDE_KEYS`): values typed (TOML) or strings (Spark data-source options); unknown
   keys are refused naming the nearest valid one.

The job's settings: a job builds its settings once, from the environment and its
``[storage]`` section (``pipelines.jobrun``), and installs them with :func:`use_job_settings`;
every lake call given no ``settings=`` then uses :meth:`StorageSettings.default`, those, so a
``[storage]`` endpoint or key reaches every reader and writer of the run (ingest, lookups,
divergence, maintain, retention, quality, decode, ``loglake sql``) without each call site
passing it. Outside a job (tests, ``loglake sql``), the default is the environment's. Spark's
Python workers do not inherit it: the driver ships its resolved settings inside the tasks
(``pipelines.delta.direct``) or as ``storage.*`` options (``pipelines.delta.source``).

From them: delta-rs ``storage_options`` (:meth:`StorageSettings.delta_options`) and a pyarrow
filesystem (:meth:`StorageSettings.filesystem`). On S3 the delta-rs options always carry
``conditional_put="etag"``: delta-rs then commits with ``If-None-Match: *`` (put-if-absent),
which AWS S3, MinIO and moto honour, instead of an unsafe copy-then-delete rename.
GCS and Azure take their settings through ``options`` (delta-rs / object_store key names,
e.g. ``google_service_account``, ``azure_storage_account_key``), passed through unchanged.

Nothing here talks to the store: building settings is pure.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from logstore.errors import InvalidConfigError
from logstore.objectstore.location import LakeLocation

if TYPE_CHECKING:
    import pyarrow.fs as pafs

__all__ = [
    "DEFAULT_REGION",
    "OVERRIDE_KEYS",
    "StorageSettings",
    "delta_target",
    "use_job_settings",
]

DEFAULT_REGION = "us-east-1"

# [storage] key -> (type, description); the keys of StorageSettings.from_environment's mapping
OVERRIDE_KEYS: Mapping[str, tuple[type, str]] = {
    "endpoint_url": (str, "S3 endpoint, e.g. http://127.0.0.1:9000 (default: AWS)"),
    "access_key_id": (str, "S3 access key id"),
    "secret_access_key": (str, "S3 secret access key"),
    "session_token": (str, "S3 session token (temporary credentials)"),
    "region": (str, "S3 region"),
    "allow_http": (bool, "allow a plain-HTTP endpoint (implied by an http:// endpoint_url)"),
    "connect_timeout_s": (float, "connect timeout, seconds (0 < t <= 300)"),
    "request_timeout_s": (float, "request timeout, seconds (0 < t <= 3600)"),
    "max_attempts": (int, "tries per operation, throttling and timeouts included (1..20)"),
    "options": (dict, "extra delta-rs/object_store options, passed through (GCS, Azure)"),
}
_RANGES: Mapping[str, tuple[float, float]] = {
    "connect_timeout_s": (0.0, 300.0),
    "request_timeout_s": (0.0, 3600.0),
    "max_attempts": (1, 20),
}


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """Resolved settings; build with :meth:`from_environment`."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region: str = DEFAULT_REGION
    allow_http: bool = False
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0
    max_attempts: int = 4
    options: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def default(cls) -> StorageSettings:
        """The settings of a lake call given none: the job's (:func:`use_job_settings`), else
        the environment's, read now."""
        return _JOB_SETTINGS[0] if _JOB_SETTINGS else cls.from_environment()

    @classmethod
    def from_environment(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> StorageSettings:
        """Settings from ``environ`` (default ``os.environ``), then ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {
            "endpoint_url": env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            "access_key_id": env.get("AWS_ACCESS_KEY_ID"),
            "secret_access_key": env.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": env.get("AWS_SESSION_TOKEN"),
            "region": env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            "allow_http": _parse_bool("AWS_ALLOW_HTTP", env.get("AWS_ALLOW_HTTP", "false")),
        }
        for key, value in (overrides or {}).items():
            values[key] = _check(key, value)
        endpoint = values["endpoint_url"]
        if endpoint:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InvalidConfigError(
                    f"storage endpoint_url must be http://host[:port] or https://..., "
                    f"got {endpoint!r}"
                )
            if parts.scheme == "http":
                values["allow_http"] = True
        return cls(**{k: v for k, v in values.items() if v is not None})

    def to_overrides(self) -> dict[str, str]:
        """Every setting as strings; ``from_environment(that, environ={})`` gives these
        settings back (how the driver hands them to Spark's Python workers, whose environment
        is the JVM's, not the driver's)."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if f.name == "options":
                out.update({f"options.{k}": str(v) for k, v in value.items()})
            else:
                out[f.name] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    @classmethod
    def from_overrides(cls, flat: Mapping[str, str]) -> StorageSettings:
        """The inverse of :meth:`to_overrides` (keys case-insensitive, as Spark options are)."""
        nested: dict[str, Any] = {}
        options: dict[str, str] = {}
        for key, value in flat.items():
            k = key.lower()
            if k.startswith("options."):
                options[key[len("options.") :]] = value
            else:
                nested[k] = value
        if options:
            nested["options"] = options
        return cls.from_environment(nested, environ={})

    def delta_options(self, location: LakeLocation) -> dict[str, str]:
        """delta-rs ``storage_options`` for a table at ``location`` (empty for local disk)."""
        if location.is_local:
            return {}
        out: dict[str, str] = {}
        if location.scheme == "s3":
            out["AWS_REGION"] = self.region
            if self.endpoint_url:
                out["AWS_ENDPOINT_URL"] = self.endpoint_url
            if self.allow_http:
                out["AWS_ALLOW_HTTP"] = "true"
            if self.access_key_id:
                out["AWS_ACCESS_KEY_ID"] = self.access_key_id
            if self.secret_access_key:
                out["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
            if self.session_token:
                out["AWS_SESSION_TOKEN"] = self.session_token
            out["conditional_put"] = "etag"
        out["timeout"] = f"{int(self.request_timeout_s)}s"
        out["connect_timeout"] = f"{int(max(1, self.connect_timeout_s))}s"
        out.update(self.options)
        return out

    def filesystem(self, location: LakeLocation) -> pafs.FileSystem:
        """A pyarrow filesystem for ``location`` (paths: :attr:`LakeLocation.fs_path`).

        On S3 with pyarrow's ``allow_delayed_open``: an output stream starts a multipart
        upload only when its first part (10 MiB) is full, so a smaller object is one PUT,
        not a multipart upload of one part (create, part, complete: three requests); a
        larger one is the same multipart upload as without it, its parts going up while it
        is written. Why for every writer (the tier's segments, the lake's Parquet files, Data
        Docs, deletion vectors): counted on the tests' S3 server, a Delta append of two small
        files sends 3 writes instead of 7, and a 3,000-record ``jobs/ingest.py`` run 7 instead
        of 11 (its two data files). The price: what the open would have raised (the store
        away, access refused) comes from the write or the close instead; the store's own
        operations span both, and the lake's file writers abort the task either way. Delta
        commits and leases are not written through here (put-if-absent,
        :mod:`logstore.objectstore._s3put`)."""
        import pyarrow.fs as pafs  # noqa: PLC0415

        if location.is_local:
            return pafs.LocalFileSystem()
        if location.scheme == "s3":
            scheme = "https"
            endpoint = None
            if self.endpoint_url:
                parts = urlsplit(self.endpoint_url)
                scheme, endpoint = parts.scheme, parts.netloc
            return pafs.S3FileSystem(
                access_key=self.access_key_id,
                secret_key=self.secret_access_key,
                session_token=self.session_token,
                region=self.region,
                endpoint_override=endpoint,
                scheme=scheme,
                connect_timeout=self.connect_timeout_s,
                request_timeout=self.request_timeout_s,
                retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=self.max_attempts),
                allow_delayed_open=True,
            )
        if location.scheme == "gs":
            return pafs.GcsFileSystem(retry_time_limit=self.request_timeout_s * self.max_attempts)
        account = location.authority.split("@", 1)[1].split(".", 1)[0]
        return pafs.AzureFileSystem(
            account_name=account, account_key=self.options.get("azure_storage_account_key")
        )


# the settings installed by use_job_settings (empty: none); a list, not a global statement
_JOB_SETTINGS: list[StorageSettings] = []


def use_job_settings(settings: StorageSettings | None) -> None:
    """Make ``settings`` what :meth:`StorageSettings.default` returns in this process (None:
    the environment again). A job calls it once, before its first lake call."""
    _JOB_SETTINGS.clear()
    if settings is not None:
        _JOB_SETTINGS.append(settings)


def delta_target(
    path: str | Path | LakeLocation, *, settings: StorageSettings | None = None
) -> tuple[str, dict[str, str]]:
    """What delta-rs needs to open the table at ``path``: its URI (a plain absolute path on
    local disk) and ``storage_options`` (settings from the environment unless given)."""
    loc = path if isinstance(path, LakeLocation) else LakeLocation.parse(path)
    if loc.is_local:
        return loc.uri, {}
    resolved = settings if settings is not None else StorageSettings.default()
    return loc.uri, resolved.delta_options(loc)


def _parse_bool(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", ""):
        return False
    raise InvalidConfigError(f"storage {key} must be true or false, got {value!r}")


def _check(key: str, value: Any) -> Any:
    """One override, typed and in range (strings accepted for numbers and booleans)."""
    if key not in OVERRIDE_KEYS:
        near = difflib.get_close_matches(key, list(OVERRIDE_KEYS), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (valid: {', '.join(OVERRIDE_KEYS)})"
        raise InvalidConfigError(f"unknown [storage] key {key!r}{hint}")
    kind, _ = OVERRIDE_KEYS[key]
    if kind is bool:
        return _parse_bool(key, value)
    if kind is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise InvalidConfigError(f"storage {key} must be a table of string keys")
        return {k: str(v) for k, v in value.items()}
    if kind is str:
        if not isinstance(value, str):
            raise InvalidConfigError(f"storage {key} must be a string, got {value!r}")
        return value or None
    try:
        number = kind(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or (kind is int and isinstance(value, float)):
        kind_name = "an integer" if kind is int else "a number"
        raise InvalidConfigError(f"storage {key} must be {kind_name}, got {value!r}")
    lo, hi = _RANGES[key]
    if kind is float and not lo < number <= hi:
        raise InvalidConfigError(f"storage {key} must be in ({lo:g}, {hi:g}], got {value!r}")
    if kind is int and not lo <= number <= hi:
        raise InvalidConfigError(f"storage {key} must be in {lo:g}..{hi:g}, got {value!r}")
    return number
