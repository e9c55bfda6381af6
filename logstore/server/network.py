"""The reactor: acceptor, network processors, bounded request channel, handler pool.

Kafka's SocketServer shape, in threads:

1. One **acceptor** thread ``accept()``s on the listening socket, refuses a connection
   beyond ``max.connections`` (accept, close, log once per burst), makes it non-blocking and
   hands it round-robin to a processor.
2. ``num.network.threads`` **processors**, each with its own ``selectors`` loop, read
   size-prefixed frames (``int32 size`` then ``size`` bytes) without blocking and write
   responses. The size prefix is checked against ``socket.request.max.bytes`` *before* any
   of the frame is read; a negative or oversize prefix closes the connection. As in Kafka, a
   connection is **muted** from the moment a whole request is read until its response is
   written: one request per connection in flight, so responses leave in request order and
   produce requests of one connection are appended in the order sent. Pipelined requests
   wait in the kernel's socket buffer meanwhile.
3. The **request channel** is a bounded queue of ``queued.max.requests``. A processor that
   cannot enqueue keeps the request and stops reading from *all* its sockets until the
   channel has room, so memory stays bounded under load.
4. ``num.io.threads`` **handlers** take requests, parse them (``logstore.server.apis``),
   call the API handler, encode the response, and give it back to the connection's
   processor; a :class:`~logstore.server.context.Deferred` response is given back when it
   completes, from whatever thread completes it.
5. **Inline requests.** Two thread hand-offs per request (processor -> handler -> processor,
   each a wake-up and a GIL transfer) cost more than a cheap request itself: for a Fetch
   whose data is in the page cache they were most of its latency. The server's optional
   ``inline(request) -> bool`` hook runs on the processor thread for every whole frame; when
   it returns True it has taken the request (answered it, or left it to a Deferred) and the
   request channel is not used. The hook must not block (no fsync, no waiting); anything
   that might is declined (False) and goes to the handlers as above. A response given on
   the processor thread itself is written at once, without the response queue and wake-up.
   Muting still holds, so per-connection order is unchanged; a long-poll still waits in
   the purgatory and is answered from the thread that completes it.

Responses are sequences of byte strings and :class:`~logstore.server.context.FileRegion` s;
regions go out with ``os.sendfile`` straight from the segment file (Fetch's records), never
through Python buffers: one ``sendfile`` call asks for the whole rest of the region, so the
kernel moves as much as the socket buffer takes per call (with autotuned buffers on loopback
that is usually a whole 4 MiB partition slice), and only a short write waits for
``EVENT_WRITE``. Empty byte parts are skipped rather than sent as zero-length writes.

Bad input never takes the broker down: a malformed frame, a parse failure, an unknown API
key or unsupported version (other than ApiVersions, which gets its v0 ``UNSUPPORTED_VERSION``
answer) closes that connection after one log line; every other connection carries on.

Shutdown (:meth:`SocketServer.shutdown`): stop accepting, stop reading new requests, wait
for every request in flight to be answered (bounded wait), then close all sockets.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import os
import queue
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from logstore.server.config import BrokerConfig
from logstore.server.context import FileRegion

__all__ = ["NetworkRequest", "RateLimitedLog", "SocketServer"]

log = logging.getLogger("logstore.server.network")

_SIZE = struct.Struct(">i")
# Bytes followed by a file region are sent with MSG_MORE: the response header then leaves in
# the same segment as the region's first bytes (one wake-up of the reader, not two). Only
# ever set when a non-empty region comes next, whose sendfile pushes the data out.
_MSG_MORE: Final = getattr(socket, "MSG_MORE", 0)
_END: Final = object()  # marks the end of one response in a send queue
_CLOSE: Final = object()  # close the connection once everything before it is sent


class RateLimitedLog:
    """Logs a kind of event at most once per ``interval_s``, counting the rest.

    Keeps a flood of bad clients from flooding the log: "logged once" per burst.
    """

    def __init__(self, logger: logging.Logger, *, interval_s: float = 10.0) -> None:
        self._logger = logger
        self._interval = interval_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = collections.defaultdict(int)

    def warning(self, kind: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._suppressed[kind] += 1
                return
            self._last[kind] = now
            suppressed = self._suppressed.pop(kind, 0)
        if suppressed:
            msg += f" ({suppressed} similar events suppressed)"
        self._logger.warning(msg, *args)


@dataclass(slots=True)
class NetworkRequest:
    """One whole request frame (without its size prefix) and where it came from.

    Exactly one of :meth:`respond` / :meth:`close` must be called for it, from any thread;
    later calls are ignored (a deferred response racing a connection close is harmless).
    """

    processor: Processor
    connection_id: str
    client_host: str
    frame: bytes | memoryview  # read-only; the processor's receive buffer, never copied
    received_ns: int
    answered: bool = False

    def respond(self, parts: list[Any]) -> None:
        """Send ``parts`` and unmute the connection.

        ``parts`` is the whole response frame, size prefix included, as ``bytes`` and
        :class:`FileRegion` pieces written in order; an empty list sends nothing (acks=0).
        """
        if self._answer():
            self.processor.send_response(self.connection_id, parts)
        else:
            for p in parts:
                if isinstance(p, FileRegion):
                    p.close()

    def close(self) -> None:
        """Answer by closing the connection (unparseable or unsupported request)."""
        if self._answer():
            self.processor.close_connection(self.connection_id)

    def _answer(self) -> bool:
        with _ANSWER_LOCK:
            if self.answered:
                return False
            self.answered = True
        self.processor.server.request_done()
        return True


_ANSWER_LOCK = threading.Lock()


class _Connection:
    __slots__ = (
        "body",
        "body_read",
        "closing",
        "connection_id",
        "head",
        "head_read",
        "host",
        "last_active",
        "muted",
        "registered",
        "send_queue",
        "sock",
    )

    def __init__(self, sock: socket.socket, connection_id: str, host: str) -> None:
        self.sock = sock
        self.connection_id = connection_id
        self.host = host
        self.head = bytearray(4)
        self.head_read = 0
        self.body: bytearray | None = None
        self.body_read = 0
        self.muted = False
        self.registered = 0
        self.closing = False
        self.send_queue: collections.deque[Any] = collections.deque()
        self.last_active = time.monotonic()


class Processor(threading.Thread):
    """A network thread: owns its connections' sockets; only it touches them."""

    def __init__(self, server: SocketServer, index: int) -> None:
        super().__init__(name=f"loglake-network-{index}", daemon=True)
        self._server = server
        self.server = server
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: queue.SimpleQueue[tuple[socket.socket, str, str]] = queue.SimpleQueue()
        self._responses: queue.SimpleQueue[tuple[str, list[Any]]] = queue.SimpleQueue()
        self._conns: dict[str, _Connection] = {}
        self._pending: collections.deque[NetworkRequest] = collections.deque()
        self._reading = True
        self._running = True
        self._wake_pending = False
        self._last_idle_check = time.monotonic()

    # -- called from other threads -------------------------------------------------------

    def add_connection(self, sock: socket.socket, connection_id: str, host: str) -> None:
        self._new.put((sock, connection_id, host))
        self.wakeup()

    def send_response(self, connection_id: str, parts: list[Any]) -> None:
        """Queue ``parts`` (bytes / FileRegion) as the response of the connection's request.

        An empty list means "no response" (acks=0): the connection is unmuted. ``close``
        after the parts is requested by ending ``parts`` with the close marker via
        :meth:`close_connection`.
        """
        if threading.get_ident() == self.ident:
            # Answered inline on this processor: write now, no queue and no wake-up.
            self._deliver(connection_id, [*parts, _END])
            return
        self._responses.put((connection_id, [*parts, _END]))
        self.wakeup()

    def close_connection(self, connection_id: str) -> None:
        if threading.get_ident() == self.ident:
            self._deliver(connection_id, [_CLOSE])
            return
        self._responses.put((connection_id, [_CLOSE]))
        self.wakeup()

    def wakeup(self) -> None:
        # One pending wake-up byte is enough: the loop drains every queue after select().
        # The flag is cleared *before* the queues are drained, so a response queued after
        # the drain started always leaves a byte (or finds the flag clear and writes one).
        if self._wake_pending:
            return
        self._wake_pending = True
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\x00")

    def stop(self) -> None:
        self._running = False
        self.wakeup()

    def connection_count(self) -> int:
        return len(self._conns)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        try:
            while self._running:
                timeout = 0.01 if self._pending else 0.5
                for key, mask in self._selector.select(timeout):
                    conn = key.data
                    if conn is None:
                        with contextlib.suppress(BlockingIOError, OSError):
                            self._wake_r.recv(4096)
                        self._wake_pending = False
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._write(conn)
                    if mask & selectors.EVENT_READ and not conn.closing:
                        self._read(conn)
                self._register_new()
                self._drain_responses()
                self._flush_pending()
                self._close_idle()
        except Exception:
            log.exception("network processor %s crashed", self.name)
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    def _register_new(self) -> None:
        while True:
            try:
                sock, cid, host = self._new.get_nowait()
            except queue.Empty:
                return
            conn = _Connection(sock, cid, host)
            self._conns[cid] = conn
            self._update(conn)

    def _interest(self, conn: _Connection) -> int:
        ev = 0
        if (
            self._reading
            and not conn.muted
            and not conn.closing
            and self._server.accepting_requests
        ):
            ev |= selectors.EVENT_READ
        if conn.send_queue:
            ev |= selectors.EVENT_WRITE
        return ev

    def _update(self, conn: _Connection) -> None:
        if conn.connection_id not in self._conns:
            return
        ev = self._interest(conn)
        if ev == conn.registered:
            return
        if conn.registered == 0:
            self._selector.register(conn.sock, ev, conn)
        elif ev == 0:
            self._selector.unregister(conn.sock)
        else:
            self._selector.modify(conn.sock, ev, conn)
        conn.registered = ev

    def _set_reading(self, reading: bool) -> None:
        if reading == self._reading:
            return
        self._reading = reading
        for conn in list(self._conns.values()):
            self._update(conn)

    def _read(self, conn: _Connection) -> None:
        server = self._server
        if not server.accepting_requests:
            self._update(conn)  # shutting down: drop the read interest, read nothing more
            return
        sock = conn.sock
        try:
            while not conn.muted:
                if conn.body is None:
                    n = sock.recv_into(memoryview(conn.head)[conn.head_read :])
                    if n == 0:
                        self._close(conn)
                        return
                    conn.last_active = time.monotonic()
                    conn.head_read += n
                    if conn.head_read < 4:
                        return
                    (size,) = _SIZE.unpack(conn.head)
                    if size < 0 or size > server.max_request_size:
                        server.bad_input.warning(
                            "oversize",
                            "closing %s: request size %d outside [0, %d]"
                            " (socket.request.max.bytes)",
                            conn.connection_id,
                            size,
                            server.max_request_size,
                        )
                        self._close(conn)
                        return
                    conn.body = bytearray(size)
                    conn.body_read = 0
                    if size == 0:
                        self._complete_frame(conn)
                        if conn.closing:
                            return
                        continue
                view = memoryview(conn.body)[conn.body_read :]
                n = sock.recv_into(view)
                if n == 0:
                    self._close(conn)
                    return
                conn.last_active = time.monotonic()
                conn.body_read += n
                if conn.body_read == len(conn.body):
                    self._complete_frame(conn)
                    if conn.closing:
                        return
                else:
                    return
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
                log.debug("read error on %s: %s", conn.connection_id, exc)
            self._close(conn)

    def _complete_frame(self, conn: _Connection) -> None:
        body = conn.body
        assert body is not None
        conn.body = None
        conn.head_read = 0
        conn.muted = True
        # A read-only view, not a copy: the buffer was allocated for this frame alone and the
        # connection lets go of it above (kio insists on read-only input).
        frame = memoryview(body).toreadonly()
        req = NetworkRequest(self, conn.connection_id, conn.host, frame, time.monotonic_ns())
        if self._server.run_inline(req):
            # Usually answered and written already: then the connection stays registered
            # for reading and no selector call is made at all.
            self._update(conn)
            return
        self._update(conn)
        if self._pending or not self._server.enqueue(req):
            self._pending.append(req)
            self._set_reading(False)

    def _flush_pending(self) -> None:
        while self._pending:
            if not self._server.enqueue(self._pending[0]):
                return
            self._pending.popleft()
        self._set_reading(True)

    def _drain_responses(self) -> None:
        while True:
            try:
                cid, parts = self._responses.get_nowait()
            except queue.Empty:
                return
            self._deliver(cid, parts)

    def _deliver(self, cid: str, parts: list[Any]) -> None:
        conn = self._conns.get(cid)
        if conn is None:
            for p in parts:
                if isinstance(p, FileRegion):
                    p.close()
            return
        conn.send_queue.extend(parts)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        q = conn.send_queue
        sock = conn.sock
        try:
            while q:
                part = q[0]
                if part is _END:
                    q.popleft()
                    conn.muted = False
                    continue
                if part is _CLOSE:
                    self._close(conn)
                    return
                if isinstance(part, FileRegion):
                    if part.length == 0:
                        part.close()
                        q.popleft()
                        continue
                    n = os.sendfile(sock.fileno(), part.fd, part.position, part.length)
                    if n == 0:
                        # The file ended before the region did: never send a short frame.
                        log.error(
                            "segment shorter than the fetch region; closing %s",
                            conn.connection_id,
                        )
                        self._close(conn)
                        return
                    part.position += n
                    part.length -= n
                    if part.length:
                        # The socket buffer is full: wait for EVENT_WRITE (the kernel wakes
                        # us once a good part of it is free) rather than spin on small writes.
                        break
                    part.close()
                    q.popleft()
                    continue
                if not part:
                    q.popleft()
                    continue
                nxt = q[1] if len(q) > 1 else None
                more = isinstance(nxt, FileRegion) and nxt.length > 0
                n = sock.send(part, _MSG_MORE if more else 0)
                if n < len(part):
                    q[0] = memoryview(part)[n:]
                    break
                q.popleft()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            log.debug("write error on %s: %s", conn.connection_id, exc)
            self._close(conn)
            return
        conn.last_active = time.monotonic()
        self._update(conn)
        # A request may already be complete in the kernel buffer: the selector reports it.

    def _close(self, conn: _Connection) -> None:
        if self._conns.pop(conn.connection_id, None) is None:
            return
        conn.closing = True
        if conn.registered:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
            conn.registered = 0
        with contextlib.suppress(OSError):
            conn.sock.close()
        for p in conn.send_queue:
            if isinstance(p, FileRegion):
                p.close()
        conn.send_queue.clear()
        self._server.connection_closed()

    def _close_idle(self) -> None:
        now = time.monotonic()
        if now - self._last_idle_check < 1.0:
            return
        self._last_idle_check = now
        limit = self._server.idle_timeout_s
        for conn in list(self._conns.values()):
            if not conn.muted and not conn.send_queue and now - conn.last_active > limit:
                self._close(conn)

    def idle(self) -> bool:
        """True when nothing is pending, in flight or waiting to be written."""
        return not self._pending and all(
            not c.muted and not c.send_queue for c in self._conns.values()
        )


class SocketServer:
    """Listening socket, acceptor, processors, request channel and handler threads.

    ``dispatch(request)`` runs on a handler thread and must eventually call
    ``request.respond(parts)`` or ``request.close()`` (directly or from a deferred
    completion); an exception out of ``dispatch`` closes the connection.

    ``inline(request) -> bool``, when given, runs on the processor thread first: True means
    it has taken the request with the same duty as ``dispatch`` (and must not have blocked),
    False sends the request on to the handlers. An exception out of it closes the connection.
    """

    def __init__(
        self,
        config: BrokerConfig,
        dispatch: Callable[[NetworkRequest], None],
        *,
        inline: Callable[[NetworkRequest], bool] | None = None,
    ) -> None:
        self._config = config
        self._dispatch = dispatch
        self._inline = inline
        self.max_request_size = config.get_int("socket.request.max.bytes")
        self.max_connections = config.get_int("max.connections")
        self.idle_timeout_s = config.get_int("connections.max.idle.ms") / 1000.0
        self.bad_input = RateLimitedLog(log)
        self.accepting_requests = True
        self._channel: queue.Queue[NetworkRequest | None] = queue.Queue(
            maxsize=config.get_int("queued.max.requests")
        )
        self._conn_lock = threading.Lock()
        self._conn_count = 0
        self._ids = itertools.count()
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener = config.listener
        try:
            self._listen.bind((listener.host or "0.0.0.0", listener.port))
        except OSError as exc:
            self._listen.close()
            raise OSError(
                exc.errno, f"cannot listen on {listener.host}:{listener.port}: {exc}"
            ) from exc
        self._listen.listen(config.get_int("socket.listen.backlog.size"))
        self.host, self.port = self._listen.getsockname()[:2]
        self._processors = [
            Processor(self, i) for i in range(config.get_int("num.network.threads"))
        ]
        self._handlers = [
            threading.Thread(target=self._handler_loop, name=f"loglake-io-{i}", daemon=True)
            for i in range(config.get_int("num.io.threads"))
        ]
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="loglake-acceptor", daemon=True
        )
        self._stopping = threading.Event()
        self._inflight = 0
        self._inflight_lock = threading.Condition()

    def start(self) -> None:
        for p in self._processors:
            p.start()
        for h in self._handlers:
            h.start()
        self._acceptor.start()

    # -- acceptor ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._listen, selectors.EVENT_READ)
        rr = itertools.cycle(self._processors)
        send_buf = self._config.get_int("socket.send.buffer.bytes")
        recv_buf = self._config.get_int("socket.receive.buffer.bytes")
        try:
            while not self._stopping.is_set():
                if not sel.select(0.2):
                    continue
                try:
                    sock, addr = self._listen.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as exc:
                    if self._stopping.is_set():
                        return
                    self.bad_input.warning("accept", "accept failed: %s", exc)
                    time.sleep(0.05)
                    continue
                with self._conn_lock:
                    over = self._conn_count >= self.max_connections
                    if not over:
                        self._conn_count += 1
                if over:
                    self.bad_input.warning(
                        "max-connections",
                        "refusing connection from %s: max.connections=%d reached",
                        addr[0],
                        self.max_connections,
                    )
                    sock.close()
                    continue
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if send_buf > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buf)
                if recv_buf > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buf)
                local = f"{self.host}:{self.port}"
                cid = f"{local}-{addr[0]}:{addr[1]}-{next(self._ids)}"
                next(rr).add_connection(sock, cid, addr[0])
        finally:
            sel.close()

    def connection_closed(self) -> None:
        with self._conn_lock:
            self._conn_count -= 1

    @property
    def connection_count(self) -> int:
        with self._conn_lock:
            return self._conn_count

    # -- request channel ---------------------------------------------------------------

    def enqueue(self, request: NetworkRequest) -> bool:
        try:
            self._channel.put_nowait(request)
        except queue.Full:
            return False
        with self._inflight_lock:
            self._inflight += 1
        return True

    def run_inline(self, request: NetworkRequest) -> bool:
        """Offer ``request`` to the inline hook (processor thread); True if it took it."""
        if self._inline is None:
            return False
        with self._inflight_lock:
            self._inflight += 1
        try:
            taken = self._inline(request)
        except Exception:
            log.exception("inline request handler failed; closing %s", request.connection_id)
            request.close()
            return True
        if not taken:
            with self._inflight_lock:
                self._inflight -= 1
                self._inflight_lock.notify_all()
        return taken

    def request_done(self) -> None:
        """A request enqueued earlier has been answered (or its connection closed)."""
        with self._inflight_lock:
            self._inflight -= 1
            self._inflight_lock.notify_all()

    def _handler_loop(self) -> None:
        while True:
            req = self._channel.get()
            if req is None:
                return
            try:
                self._dispatch(req)
            except Exception:
                log.exception("request handler failed; closing %s", req.connection_id)
                req.close()

    # -- shutdown ----------------------------------------------------------------------

    def stop_accepting(self) -> None:
        """Close the listening socket and stop reading new requests (idempotent)."""
        self._stopping.set()
        self.accepting_requests = False
        with contextlib.suppress(OSError):
            self._listen.close()
        if self._acceptor.is_alive():
            self._acceptor.join(timeout=5)
        for p in self._processors:
            p.wakeup()

    def shutdown(self, *, timeout_s: float = 30.0) -> None:
        """Stop accepting, answer everything in flight (up to ``timeout_s``), close all."""
        self.stop_accepting()
        deadline = time.monotonic() + timeout_s
        with self._inflight_lock:
            self._inflight_lock.wait_for(lambda: self._inflight <= 0, timeout_s)
        while time.monotonic() < deadline and not all(p.idle() for p in self._processors):
            time.sleep(0.01)
        for p in self._processors:
            p.stop()
        for p in self._processors:
            p.join(timeout=5)
        for _ in self._handlers:
            self._channel.put(None)
        for h in self._handlers:
            h.join(timeout=5)
