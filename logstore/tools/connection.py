"""A minimal blocking Kafka client connection: one request in flight, kio's codecs.

:class:`KafkaConnection` frames a kio request (request header v1, or v2 for flexible
versions), sends it, reads the size-prefixed response, checks the correlation id and decodes
the response with the kio schema of the same API and version. No retries, no pipelining: the
tools and the jobs' small admin calls (``pipelines/lake_group.py``, ``pipelines/retention``)
need nothing more. Every socket failure becomes a :class:`~logstore.errors.LoglakeError`
naming the broker. Not thread-safe (one per thread).
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from logstore.errors import LoglakeError

__all__ = ["KafkaConnection"]


class KafkaConnection:
    """A blocking connection sending kio requests and reading their responses."""

    def __init__(self, bootstrap: str, *, client_id: str = "loglake-topics", timeout: float = 30.0):
        host, sep, port = bootstrap.rpartition(":")
        if not sep or not port.isdigit():
            raise LoglakeError(f"--bootstrap-server {bootstrap!r}: expected host:port")
        try:
            self._sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        except OSError as exc:
            raise LoglakeError(f"cannot connect to {bootstrap}: {exc.strerror or exc}") from exc
        self._client_id = client_id.encode()
        self._correlation_id = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> KafkaConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, request: Any) -> Any:
        self._correlation_id += 1
        head = struct.pack(
            ">hhih",
            request.__api_key__,
            request.__version__,
            self._correlation_id,
            len(self._client_id),
        )
        buf = io.BytesIO()
        buf.write(head + self._client_id + (b"\x00" if request.__flexible__ else b""))
        entity_writer(type(request))(buf, request)
        payload = buf.getvalue()
        try:
            self._sock.sendall(struct.pack(">i", len(payload)) + payload)
            (size,) = struct.unpack(">i", self._recv(4))
            frame = self._recv(size)
        except OSError as exc:
            raise LoglakeError(f"connection to the broker failed: {exc}") from exc
        (cid,) = struct.unpack_from(">i", frame, 0)
        if cid != self._correlation_id:
            raise LoglakeError(f"correlation id {cid} != {self._correlation_id}")
        cls = load_response_schema(request.__api_key__, request.__version__)
        pos = 4 + (1 if cls.__header_schema__.__flexible__ else 0)
        response, _size = entity_reader(cls)(frame, pos)
        return response

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self._sock.recv(n - len(out))
            if not chunk:
                raise LoglakeError("the broker closed the connection")
            out += chunk
        return bytes(out)
