"""What a request handler sees and what it may return.

A handler is ``handle(ctx: RequestContext, request: <kio request>) -> Response | Deferred``.
It runs on one of the broker's ``num.io.threads`` handler threads and must not block for
long: work that waits (a Fetch long-poll until ``min_bytes`` arrive, a JoinGroup until the
rebalance completes) returns a :class:`Deferred` at once and completes it later, from any
thread. The reactor keeps each connection's responses in request order: a later response on
the same connection is held back until every earlier deferred one has completed.

A *response* is one of:

- a kio response dataclass of the request's version (the reactor writes the response header
  its ``__header_schema__`` names and the body with ``kio.serial.entity_writer``);
- a :class:`RawResponse`: pre-encoded body parts, some of them file regions sent with
  ``os.sendfile`` straight from a segment file (Fetch's zero-copy path);
- :data:`NO_RESPONSE`: nothing is written back (Produce with ``acks=0``, as Kafka does).

Thread-safety: :class:`RequestContext` is immutable; :class:`Deferred` is safe to complete,
observe and wait on from any thread; its callbacks run on the completing thread (or on the
registering thread when it is already complete), exactly once each.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, Union

if TYPE_CHECKING:
    from logstore.server.config import BrokerConfig

__all__ = [
    "NO_RESPONSE",
    "CloseAfter",
    "Deferred",
    "FileRegion",
    "NoResponse",
    "RawResponse",
    "RequestContext",
    "Response",
    "monotonic_ms",
    "wall_clock_ms",
]

T = TypeVar("T")


def wall_clock_ms() -> int:
    """Milliseconds since the epoch: record timestamps, LogAppendTime, retention."""
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """A monotonic millisecond clock: timeouts and session expiry, never persisted."""
    return time.monotonic_ns() // 1_000_000


class NoResponse:
    """The marker for "write nothing back" (Produce ``acks=0``)."""

    _instance: NoResponse | None = None

    def __new__(cls) -> NoResponse:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NO_RESPONSE"


NO_RESPONSE: Final = NoResponse()


@dataclass(slots=True)
class FileRegion:
    """``length`` bytes of an open file at ``position``, sent with ``os.sendfile``.

    ``fd`` is owned by the region (a ``dup`` of the segment's descriptor taken while the
    segment was known to be open), so a segment deleted or closed by retention between the
    handler and the send cannot turn the number into another file: the region's file stays
    readable until :meth:`close`, which the reactor calls once the region is sent or the
    connection dies. If the file turns out shorter than ``length`` (truncated after a crash
    of a concurrent writer is impossible here, but guard anyway), the reactor pads nothing
    and closes the connection: a short frame must never be sent as if complete.
    """

    fd: int
    position: int
    length: int
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)


@dataclass(frozen=True, slots=True)
class CloseAfter:
    """A response after which the connection is closed (a failed SASL authentication:
    Kafka answers, then closes)."""

    response: Any


@dataclass(slots=True)
class RawResponse:
    """A response body already encoded: ``bytes`` parts and :class:`FileRegion` parts.

    The reactor writes the response header for ``flexible_header`` (header v1 with an empty
    tagged-field section when true, v0 otherwise), then each part in order; the size prefix
    is computed from the parts' lengths.
    """

    parts: list[bytes | FileRegion]
    flexible_header: bool

    @property
    def size(self) -> int:
        return sum(len(p) if isinstance(p, bytes) else p.length for p in self.parts)

    def close(self) -> None:
        """Release every file region (the response was sent, or will never be)."""
        for p in self.parts:
            if isinstance(p, FileRegion):
                p.close()


class Deferred(Generic[T]):
    """A value that arrives later, completed exactly once from any thread.

    ``complete(value)`` / ``fail(exc)`` return whether this call completed it (the first
    one wins, later ones are ignored and return False, so a timeout and a wake-up may race
    safely). ``add_done_callback(fn)`` calls ``fn(self)`` once it is complete. ``result``
    blocks (optionally with a timeout) and re-raises a failure.
    """

    __slots__ = ("_callbacks", "_cond", "_done", "_error", "_value")

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Deferred[T]], None]] = []

    @classmethod
    def completed(cls, value: T) -> Deferred[T]:
        d: Deferred[T] = cls()
        d.complete(value)
        return d

    def done(self) -> bool:
        return self._done

    def complete(self, value: T) -> bool:
        return self._finish(value, None)

    def fail(self, error: BaseException) -> bool:
        return self._finish(None, error)

    def _finish(self, value: T | None, error: BaseException | None) -> bool:
        with self._cond:
            if self._done:
                return False
            self._value = value
            self._error = error
            self._done = True
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for cb in callbacks:
            cb(self)
        return True

    def add_done_callback(self, fn: Callable[[Deferred[T]], None]) -> None:
        with self._cond:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def result(self, timeout: float | None = None) -> T:
        """The value; raises the failure, or ``TimeoutError`` if not complete in time."""
        with self._cond:
            if not self._done and not self._cond.wait_for(lambda: self._done, timeout):
                raise TimeoutError("deferred response not complete")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Deferred(done={self._done})"


# kio response dataclass instance | pre-encoded body | nothing.
Response = Union[Any, RawResponse, NoResponse]  # noqa: UP007 - readable alias


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestContext:
    """Everything a handler may use, besides the request itself.

    ``broker`` is the running :class:`logstore.server.broker.Broker` (typed loosely here to
    keep this module free of import cycles; it exposes ``log_manager``, ``config``,
    ``group_coordinator``, ``node_id``, ``advertised_host``, ``advertised_port`` and
    ``purgatory``). ``wall_clock`` gives epoch ms (timestamps), ``monotonic`` gives ms for
    timeouts. ``connection_id`` is unique per accepted socket for the broker's lifetime
    (``"<local>-<peer>-<n>"`` as Kafka forms it); ``client_host`` is the peer address.
    """

    broker: Any
    config: BrokerConfig
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    connection_id: str
    client_host: str
    listener: str = ""  # the listener the request came in through ("": the first)
    # User:ANONYMOUS, User:<SASL user>, or the mTLS certificate's mapped subject
    principal: str = "User:ANONYMOUS"
    wall_clock: Callable[[], int] = field(default=wall_clock_ms)
    monotonic: Callable[[], int] = field(default=monotonic_ms)

    @property
    def advertised(self) -> tuple[str, int]:
        """(host, port) this broker advertises to clients of the request's listener: Kafka
        answers Metadata and FindCoordinator with the listener the client connected to."""
        by_name = getattr(self.broker, "advertised", {})
        if self.listener in by_name:
            host, port = by_name[self.listener]
            return str(host), int(port)
        return str(self.broker.advertised_host), int(self.broker.advertised_port)

    @property
    def log_manager(self) -> Any:
        return self.broker.log_manager

    @property
    def group_coordinator(self) -> Any:
        return self.broker.group_coordinator
