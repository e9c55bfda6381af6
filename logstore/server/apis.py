"""The API registry and the request/response framing around kio's codecs.

Registry: ``api_key -> (min_version, max_version, handler)``: :mod:`logstore.server.registry`
(every API but ApiVersions, plain imports: a broken handler module fails the import, so the
broker does not start) plus ApiVersions. ApiVersions advertises exactly this registry,
because clients choose what to send from it (librdkafka silently downgrades to magic 0
without Fetch v4+, and may drop compression without FindCoordinator).

Wire format of a request frame (after the 4-byte size prefix, all big-endian)::

    request_api_key i16, request_api_version i16, correlation_id i32,
    client_id nullable legacy string (i16 length, -1 = null)   -- even in header v2
    [header v2 only: tagged fields (uvarint count, then uvarint tag, uvarint size, bytes)]
    body (the request's kio schema of that version)

Header v2 is used when the request's version is flexible (``__flexible__``), v1 otherwise.
A response frame is ``correlation_id i32`` [+ empty tagged fields for response header v1]
then the body; ApiVersions responses always use header v0 (KIP-511) so that a client that
sent a too-new version can still read the error.

Thread-safety: the registry is built once at import and read-only afterwards; the codec
caches are filled under the GIL with idempotent values.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import struct
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

from logstore.errors import LoglakeError
from logstore.server import registry
from logstore.server.context import RawResponse
from logstore.server.handlers import api_versions
from logstore.server.registry import Handler

__all__ = [
    "API_HANDLERS",
    "API_VERSIONS_KEY",
    "Handler",
    "InvalidRequestError",
    "RequestHeader",
    "UnsupportedVersionError",
    "decode_request",
    "encode_response",
    "field_specs",
    "parse_request_header",
    "response_header_bytes",
]

log = logging.getLogger(__name__)

API_VERSIONS_KEY: Final = api_versions.API_KEY


class InvalidRequestError(LoglakeError):
    """A request frame that cannot be parsed (truncated, bad lengths or encodings)."""


class UnsupportedVersionError(LoglakeError):
    """An API key the broker does not implement, or a version outside its range."""

    def __init__(self, message: str, *, api_key: int, api_version: int) -> None:
        super().__init__(message)
        self.api_key = api_key
        self.api_version = api_version


API_HANDLERS: Final[Mapping[int, tuple[int, int, Handler]]] = MappingProxyType(
    dict(
        sorted(
            {
                **registry.API_HANDLERS,
                api_versions.API_KEY: (
                    api_versions.MIN_VERSION,
                    api_versions.MAX_VERSION,
                    api_versions.handle,
                ),
            }.items()
        )
    )
)


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body_offset: int


_HEAD = struct.Struct(">hhi")
_I16 = struct.Struct(">h")


def _read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidRequestError("truncated varint in request header", position=pos)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise InvalidRequestError("varint longer than 5 bytes", position=pos)


_REQUEST_CLASSES: Final[dict[tuple[int, int], type[Any]]] = {}


def _request_class(api_key: int, api_version: int) -> type[Any]:
    """kio's request class, imported on first use: importing all ~100 schema modules up
    front would cost seconds of start-up for versions no client may ever send."""
    cls = _REQUEST_CLASSES.get((api_key, api_version))
    if cls is None:
        cls = _REQUEST_CLASSES[(api_key, api_version)] = load_request_schema(api_key, api_version)
    return cls


def parse_request_header(frame: bytes | memoryview) -> RequestHeader:
    """Parse the header of a request frame (see the module docstring for the bytes).

    Raises :class:`UnsupportedVersionError` for an API key or version outside the registry
    (the header's first 8 bytes are still valid then, so the caller can answer), and
    :class:`InvalidRequestError` when the header itself is truncated or malformed.
    """
    if len(frame) < 10:
        raise InvalidRequestError(f"request header needs >= 10 bytes, got {len(frame)}")
    api_key, api_version, correlation_id = _HEAD.unpack_from(frame, 0)
    (n,) = _I16.unpack_from(frame, 8)
    pos = 10
    client_id: str | None = None
    if n >= 0:
        if pos + n > len(frame):
            raise InvalidRequestError("client_id runs past the end of the frame", position=pos)
        try:
            client_id = str(frame[pos : pos + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequestError("client_id is not UTF-8", position=pos) from exc
        pos += n
    elif n != -1:
        raise InvalidRequestError(f"client_id length {n} is negative", position=8)
    entry = API_HANDLERS.get(api_key)
    if entry is None or not entry[0] <= api_version <= entry[1]:
        raise UnsupportedVersionError(
            f"api key {api_key} version {api_version} is not supported",
            api_key=api_key,
            api_version=api_version,
        )
    if _request_class(api_key, api_version).__flexible__:
        count, pos = _read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = _read_uvarint(frame, pos)
            size, pos = _read_uvarint(frame, pos)
            pos += size
            if pos > len(frame):
                raise InvalidRequestError("tagged field runs past the end", position=pos)
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos)


def decode_request(frame: bytes | memoryview, header: RequestHeader) -> Any:
    """The kio request object of ``header``'s API and version, parsed from ``frame``.

    Raises :class:`InvalidRequestError` on any parse failure (kio raises a variety of
    exceptions on bad input; they are all the client's fault here). Trailing bytes after the
    last field are ignored, as Kafka's own parsers do.
    """
    cls = _request_class(header.api_key, header.api_version)
    try:
        request, size = entity_reader(cls)(frame, header.body_offset)
    except Exception as exc:
        raise InvalidRequestError(
            f"cannot parse {cls.__name__} v{header.api_version}: {exc}",
            position=header.body_offset,
        ) from exc
    _check_nulls(request, cls.__name__)
    if header.body_offset + size != len(frame):
        # Kafka's generated parsers ignore bytes after the last field, and librdkafka 2.x
        # sends Metadata v12 requests with 3 such bytes: tolerated, as Kafka does.
        log.debug(
            "%s v%d: %d trailing bytes ignored",
            cls.__name__,
            header.api_version,
            len(frame) - header.body_offset - size,
        )
    return request


# Per kio class: (field name, may be null, holds entities): for the null check below and
# the metrics' error counts (logstore.server.metrics).
_FIELD_SPECS: Final[dict[type[Any], tuple[tuple[str, bool, bool], ...]]] = {}


def field_specs(cls: type[Any]) -> tuple[tuple[str, bool, bool], ...]:
    specs = _FIELD_SPECS.get(cls)
    if specs is None:
        out = []
        for f in dataclasses.fields(cls):
            t = f.type
            args = typing.get_args(t)
            nullable = t is type(None) or type(None) in args
            inner = [a for a in args if a is not type(None) and a is not Ellipsis]
            if typing.get_origin(t) is tuple or any(typing.get_origin(a) is tuple for a in inner):
                inner = [x for a in inner for x in (typing.get_args(a) or (a,))]
            holds_entities = any(dataclasses.is_dataclass(a) for a in [t, *inner])
            out.append((f.name, nullable, holds_entities))
        specs = _FIELD_SPECS[cls] = tuple(out)
    return specs


def _check_nulls(obj: Any, where: str) -> None:
    """kio returns None for an array or string sent with length -1 even where the schema
    does not allow null; Kafka rejects such a request, and so do we (instead of letting a
    handler trip over it)."""
    for name, nullable, holds_entities in field_specs(type(obj)):
        value = getattr(obj, name)
        if value is None:
            if not nullable:
                raise InvalidRequestError(f"{where}.{name} is null but may not be")
            continue
        if holds_entities:
            if isinstance(value, tuple):
                for item in value:
                    if dataclasses.is_dataclass(item):
                        _check_nulls(item, f"{where}.{name}")
            elif dataclasses.is_dataclass(value):
                _check_nulls(value, f"{where}.{name}")


def response_header_bytes(correlation_id: int, *, flexible: bool) -> bytes:
    """Response header v1 (correlation id + empty tagged fields) or v0."""
    return struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"")


def encode_response(correlation_id: int, response: Any) -> bytes:
    """A whole response frame (size prefix included) for a kio response object."""
    if isinstance(response, RawResponse):
        raise TypeError("RawResponse is written by the reactor part by part")
    flexible = response.__header_schema__.__flexible__
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(response_header_bytes(correlation_id, flexible=flexible))
    entity_writer(type(response))(buf, response)
    out = buf.getbuffer()
    struct.pack_into(">i", out, 0, len(out) - 4)
    del out
    return buf.getvalue()
