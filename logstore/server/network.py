"""The reactor: acceptor, network processors, bounded request channel, handler pool.

Kafka's SocketServer shape, in threads:

1. One **acceptor** thread ``accept()``s on the non-blocking listening socket, as many
   connections per wake-up as are waiting, refuses a connection beyond ``max.connections``
   or ``max.connections.per.ip`` (accept, close, log once per burst), makes it non-blocking
   and hands it round-robin to a processor, waking each processor once per batch. Bursts of
   thousands of connections a second wait in the kernel's accept queue
   (``socket.listen.backlog.size``) meanwhile; a queue that overflows drops SYNs, which
   costs the client a 1 s, 3 s, 7 s ... retransmission.
2. ``num.network.threads`` **processors**, each with its own ``selectors`` loop, read
   size-prefixed frames (``int32 size`` then ``size`` bytes) without blocking and write
   responses. The size prefix is checked against ``socket.request.max.bytes`` *before* any
   of the frame is read; a negative or oversize prefix closes the connection. As in Kafka, a
   connection is **muted** from the moment a whole request is read until its response is
   written: one request per connection in flight, so responses leave in request order and
   produce requests of one connection are appended in the order sent. Pipelined requests
   wait in the kernel's socket buffer meanwhile.
3. **Request memory** is bounded (KIP-72): see "Memory" below.
4. The **request channel** is a bounded queue of ``queued.max.requests``. A processor that
   cannot enqueue keeps the request and stops reading from *all* its sockets until the
   channel has room.
5. ``num.io.threads`` **handlers** take requests, parse them (``logstore.server.apis``),
   call the API handler, encode the response, and give it back to the connection's
   processor; a :class:`~logstore.server.context.Deferred` response is given back when it
   completes, from whatever thread completes it.
6. **Inline requests.** Two thread hand-offs per request (processor -> handler -> processor,
   each a wake-up and a GIL transfer) cost more than a cheap request itself: for a Fetch
   whose data is in the page cache they were most of its latency. The server's optional
   ``inline(request) -> bool`` hook runs on the processor thread for every whole frame; when
   it returns True it has taken the request (answered it, or left it to a Deferred) and the
   request channel is not used. The hook must not block (no fsync, no waiting); anything
   that might is declined (False) and goes to the handlers as above. A response given on
   the processor thread itself is written at once, without the response queue and wake-up.
   Muting still holds, so per-connection order is unchanged; a long-poll still waits in
   the purgatory and is answered from the thread that completes it.

Memory. A frame's bytes are buffered only as they arrive: nothing is allocated for a frame
until its first bytes are in the socket's receive buffer, the buffer starts at what has
arrived (at least ``_FIRST_PIECE``, at most the frame) and grows, when full, to at most
twice its size or to what has arrived by then. Every growth is reserved first from the
broker's :class:`~logstore.server.memory_pool.MemoryPool` of ``queued.max.request.bytes``;
the frame's memory goes back to the pool when its request is answered (or its connection
closes first). A reservation that does not fit mutes that connection's reading
(back-pressure: the client's bytes wait in its socket, nothing is dropped or failed) until
the pool has reserved the memory on its behalf; first come, first served, and one frame at
a time may overdraw the pool so that reading always makes progress (the pool's docstring
has the rules and the bound: ``queued.max.request.bytes + socket.request.max.bytes``). A
whole frame is handed over as a read-only view of its buffer, never copied: the buffer's
final size is the frame's size. Per connection: one frame at a time (muting), so a
connection holds at most one ``socket.request.max.bytes`` frame, buffered no faster than
its bytes arrive.

Allocator. Request frames, their parsed copies and the produce path's copy of the records
are large (a 1 MB producer batch is ~0.5-1 MB a request) and freed after each request, often
on another thread than the one that allocated them. With glibc's default, adaptive
thresholds a handler thread's arena gave that memory back to the kernel after nearly every
request once the memory freed last lay at the top of the arena (``madvise``
``MADV_DONTNEED`` when the free top passed twice the mmap threshold, ~1 MB), and the next
request faulted the same pages in again: ~300 ``madvise`` calls for 300k 1 KiB records,
three times the broker's system time, ~25 % fewer 1 KiB records a second (issue 20). Which
allocation lands last is an accident of the code: the partition layer (commit b5bfbf3)
changed the order of a produce request's allocations and made the storm the usual case
(bisected by counting ``madvise`` under ``strace -c``: the commit before it, 5-20 a run).
:func:`tune_allocator` therefore fixes the thresholds once per process (``mallopt``:
allocations below ``_MMAP_THRESHOLD`` from the arenas, freed memory kept until an arena's
free top passes ``_TRIM_THRESHOLD``), so request memory is reused whatever the order. The
request memory pool still bounds what requests hold; what glibc keeps free is bounded by the
trim threshold per arena. Other C libraries: nothing is changed.

Deadlines. A connection that has begun a request (a first byte of its size prefix) must
finish it within ``socket.request.read.timeout.ms`` or is closed (slowloris clients cannot
pin memory or connections); time spent muted by the broker (waiting for pool memory, a full
request channel) does not count. A connection with nothing in flight and nothing read or
written for ``connections.max.idle.ms`` is closed, as in Kafka.

Responses are sequences of byte strings and :class:`~logstore.server.context.FileRegion` s;
regions go out with ``os.sendfile`` straight from the segment file (Fetch's records), never
through Python buffers: one ``sendfile`` call asks for the whole rest of the region, so the
kernel moves as much as the socket buffer takes per call (with autotuned buffers on loopback
that is usually a whole 4 MiB partition slice), and only a short write waits for
``EVENT_WRITE``. Empty byte parts are skipped rather than sent as zero-length writes.

Listeners. ``listeners`` may name several client listeners (PLAINTEXT, SSL), each on its
own listening socket, all served by the one acceptor and the same processors; every
connection remembers the listener it came through (:attr:`NetworkRequest.listener`), so that
Metadata and FindCoordinator advertise that listener's address, as Kafka does.

TLS. A connection of an SSL listener is wrapped on its processor (non-blocking, no handshake
on connect) and the handshake runs in steps from the selector: ``SSLWantReadError`` waits
for EVENT_READ, ``SSLWantWriteError`` for EVENT_WRITE, no frame is read before it completes.
It must complete within ``socket.request.read.timeout.ms`` or the connection is closed (a
client that connects and says nothing pins no slot); a failed handshake (plaintext bytes on
the port: WRONG_VERSION_NUMBER; a client certificate from another CA; none where
``ssl.client.auth=required``) closes the connection after one rate-limited log line. OpenSSL
decrypts whole records, so decrypted bytes can wait inside it where the selector cannot see
them: a TLS connection reads until OpenSSL wants more (``SSLWantReadError``), and after each
selector round the TLS connections with :meth:`ssl.SSLSocket.pending` bytes that may read
are read. Writes never use ``MSG_MORE`` (an SSL socket takes no flags). Fetch cannot use
``sendfile`` through TLS: Python 3.11's ``ssl`` offers no kernel TLS (``OP_ENABLE_KTLS``
came in 3.12 and needs a kernel and OpenSSL built for it), so a file region goes out as
``pread`` chunks of at most ``_TLS_CHUNK`` (256 KiB) bytes, the next one read only when the
previous one is sent: at most one chunk per TLS connection with a fetch in flight.

Bad input never takes the broker down: a malformed frame, a parse failure, an unknown API
key or unsupported version (other than ApiVersions, which gets its v0 ``UNSUPPORTED_VERSION``
answer) closes that connection after one log line; every other connection carries on.

The listening sockets, the acceptor, the request channel and the handler threads are
:class:`~logstore.server.socket_server.SocketServer`'s; the processors are this module's.

Shutdown (:meth:`SocketServer.shutdown`): stop accepting, stop reading new requests, wait
for every request in flight to be answered (bounded wait), then close all sockets.
"""

from __future__ import annotations

import array
import collections
import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import queue
import selectors
import socket
import ssl
import struct
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from logstore.server.context import FileRegion
from logstore.server.memory_pool import Claim
from logstore.server.security.principal import (
    ANONYMOUS,
    PrincipalError,
    map_principal,
    subject_dn,
)

if TYPE_CHECKING:  # the server owns its processors: a cycle at type-checking time only
    from logstore.server.socket_server import SocketServer

__all__ = ["NetworkRequest", "Processor", "RateLimitedLog", "tune_allocator"]

log = logging.getLogger("logstore.server.network")

_SIZE = struct.Struct(">i")
# Bytes followed by a file region are sent with MSG_MORE: the response header then leaves in
# the same segment as the region's first bytes (one wake-up of the reader, not two). Only
# ever set when a non-empty region comes next, whose sendfile pushes the data out.
_MSG_MORE: Final = getattr(socket, "MSG_MORE", 0)
_END: Final = object()  # marks the end of one response in a send queue
_CLOSE: Final = object()  # close the connection once everything before it is sent
# A frame's first buffer is what has arrived, but at least this much (or the whole frame):
# most requests are smaller and then take one buffer of exactly their size.
_FIRST_PIECE: Final = 64 * 1024
# A file region sent over TLS is read into a buffer this large at most (see "TLS").
_TLS_CHUNK: Final = 256 * 1024
# Grows a bytearray in place without writing the new bytes (``bytearray.extend`` would
# first build and copy a temporary of zeros that recv_into overwrites at once). PyDLL: the
# GIL stays held and a Python error it sets is raised.
_bytearray_resize = ctypes.pythonapi.PyByteArray_Resize
_bytearray_resize.argtypes = [ctypes.py_object, ctypes.c_ssize_t]
_bytearray_resize.restype = ctypes.c_int
# glibc mallopt parameters (malloc.h) and the values tune_allocator sets; see "Allocator".
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
_MMAP_THRESHOLD: Final = 8 * 1024 * 1024
_TRIM_THRESHOLD: Final = 32 * 1024 * 1024


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
        self.log(logging.WARNING, kind, msg, *args)

    def info(self, kind: str, msg: str, *args: object) -> None:
        self.log(logging.INFO, kind, msg, *args)

    def log(self, level: int, kind: str, msg: str, *args: object) -> None:
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
        self._logger.log(level, msg, *args)


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
    claim: Claim | None = None  # the frame's pool memory, given back when answered
    listener: str = ""  # name of the listener the connection came in through
    principal: str = ANONYMOUS  # who the connection is, before SASL (mTLS: its certificate)

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
        server = self.processor.server
        if self.claim is not None:
            # The handler is done with the frame: its memory goes back to the pool (and on
            # to connections waiting for it). Kafka's RequestChannel.Request.releaseBuffer.
            server.memory_pool.release(self.claim)
        server.request_done()
        return True


_ANSWER_LOCK = threading.Lock()


class _Connection:
    """One client connection; only its processor's thread touches it.

    Reading a frame: ``head`` collects the 4-byte size prefix (``head_read`` bytes so far);
    then ``size`` is the frame's size (-1 between frames), ``claim`` its pool memory,
    ``body`` its buffer (None until its first bytes arrive; ``len(body) <= claim.held``)
    and ``received`` the bytes of it read so far. ``read_deadline`` is when the frame must
    be whole; ``waiting_memory`` is set while the pool has not yet given the next piece
    (reading is muted meanwhile, since ``wait_start``).
    """

    __slots__ = (
        "body",
        "claim",
        "closing",
        "connection_id",
        "handshaking",
        "head",
        "head_read",
        "host",
        "last_active",
        "listener",
        "muted",
        "on_memory",
        "principal",
        "read_deadline",
        "received",
        "registered",
        "sasl",
        "send_queue",
        "size",
        "sock",
        "tls",
        "wait_start",
        "waiting_memory",
        "want_write",
    )

    def __init__(self, sock: socket.socket, connection_id: str, host: str, listener: str) -> None:
        self.sock = sock
        self.connection_id = connection_id
        self.host = host
        self.listener = listener
        self.tls = isinstance(sock, ssl.SSLSocket)
        # TLS: True until the handshake is done; want_write while OpenSSL waits to write.
        self.handshaking = self.tls
        self.want_write = False
        self.principal = ANONYMOUS  # mTLS: from the client certificate after the handshake
        self.sasl = False  # on a SASL listener: frames are small until authenticated
        self.head = bytearray(4)
        self.head_read = 0
        self.size = -1
        self.body: bytearray | None = None
        self.received = 0
        self.claim: Claim | None = None
        self.on_memory: Callable[[], None] | None = None
        self.read_deadline = 0.0
        self.waiting_memory = False
        self.wait_start = 0.0
        self.muted = False
        self.registered = 0
        self.closing = False
        self.send_queue: collections.deque[Any] = collections.deque()
        self.last_active = time.monotonic()

    def reading_frame(self) -> bool:
        """True from the first byte of a size prefix until the whole frame is read."""
        return self.head_read > 0 or self.size >= 0


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
        self._new: queue.SimpleQueue[tuple[socket.socket, str, str, str, ssl.SSLContext | None]] = (
            queue.SimpleQueue()
        )
        self._responses: queue.SimpleQueue[tuple[str, list[Any]]] = queue.SimpleQueue()
        self._memory_ready: queue.SimpleQueue[_Connection] = queue.SimpleQueue()
        self._pool = server.memory_pool
        self._conns: dict[str, _Connection] = {}
        self._tls_conns: dict[str, _Connection] = {}  # the TLS ones among _conns
        self._pending: collections.deque[NetworkRequest] = collections.deque()
        self._reading = True
        self._paused_since = 0.0
        self._running = True
        self._wake_pending = False
        self._last_timeout_check = time.monotonic()
        self._fionread = array.array("i", [0])

    # -- called from other threads -------------------------------------------------------

    def add_connection(
        self,
        sock: socket.socket,
        connection_id: str,
        host: str,
        *,
        listener: str = "",
        tls: ssl.SSLContext | None = None,
        wake: bool = True,
    ) -> None:
        """Take over ``sock`` (accepted through ``listener``; TLS with context ``tls``);
        ``wake=False`` when the caller wakes the processor itself after a batch."""
        self._new.put((sock, connection_id, host, listener, tls))
        if wake:
            self.wakeup()

    def memory_ready(self, conn: _Connection) -> None:
        """The pool has reserved the piece ``conn`` waited for (called from any thread)."""
        self._memory_ready.put(conn)
        if threading.get_ident() != self.ident:
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
                    if conn.handshaking:
                        self._handshake(conn)
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._write(conn)
                    if mask & selectors.EVENT_READ and not conn.closing:
                        self._read(conn)
                if self._tls_conns:
                    self._read_tls_buffered()
                self._register_new()
                self._drain_responses()
                self._drain_memory_ready()
                self._flush_pending()
                self._check_timeouts()
        except Exception:
            log.exception("network processor %s crashed", self.name)
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()

    # The drains run after every select(): empty() first, since a get_nowait() that raises
    # queue.Empty costs ~1.3 us, several times per request. Only this thread takes from the
    # queues, so a queue that is not empty cannot run dry before the get.

    def _register_new(self) -> None:
        new = self._new
        while not new.empty():
            sock, cid, host, listener, tls = new.get_nowait()
            if tls is not None:
                try:
                    sock = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):  # reset before we got to it
                    sock.close()
                    self._server.connection_closed(host)
                    continue
            conn = _Connection(sock, cid, host, listener)
            conn.sasl = listener in self._server.sasl_listeners
            conn.on_memory = functools.partial(self.memory_ready, conn)
            self._conns[cid] = conn
            if conn.tls:
                self._tls_conns[cid] = conn
                conn.read_deadline = time.monotonic() + self._server.request_read_timeout_s
            self._update(conn)

    # -- TLS (module docstring, "TLS") -----------------------------------------------------

    def _handshake(self, conn: _Connection) -> None:
        """One step of the server handshake, as far as the socket allows without blocking."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            conn.want_write = False
        except ssl.SSLWantWriteError:
            conn.want_write = True
        except (ssl.SSLError, OSError) as exc:
            # Plaintext on a TLS port, a certificate from another CA, a reset: refused here.
            self._server.bad_input.warning(
                "tls-handshake",
                "closing %s: TLS handshake failed on listener %s: %s",
                conn.connection_id,
                conn.listener,
                exc,
            )
            self._close(conn)
            return
        else:
            cert = sock.getpeercert()
            if cert:
                try:
                    conn.principal = map_principal(
                        subject_dn(cert), self._server.principal_rules[conn.listener]
                    )
                except PrincipalError as exc:
                    self._server.bad_input.warning(
                        "tls-principal", "closing %s: %s", conn.connection_id, exc
                    )
                    self._close(conn)
                    return
            conn.handshaking = False
            conn.want_write = False
            conn.last_active = time.monotonic()
        self._update(conn)

    def _read_tls_buffered(self) -> None:
        """Read what OpenSSL has already decrypted: the selector cannot see those bytes
        (they left the socket with an earlier record), e.g. a pipelined request that
        arrived while its connection was muted."""
        for conn in list(self._tls_conns.values()):
            if (
                conn.registered & selectors.EVENT_READ
                and not conn.closing
                and not conn.handshaking
                and conn.sock.pending()  # type: ignore[attr-defined]
            ):
                self._read(conn)

    def _interest(self, conn: _Connection) -> int:
        if conn.handshaking:
            return selectors.EVENT_WRITE if conn.want_write else selectors.EVENT_READ
        ev = 0
        if (
            self._reading
            and not conn.muted
            and not conn.waiting_memory
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
        now = time.monotonic()
        if not reading:
            self._paused_since = now
        paused = now - self._paused_since
        for conn in list(self._conns.values()):
            if reading and conn.reading_frame():
                # The broker stopped reading, not the client: that time is not the client's.
                conn.read_deadline += paused
            self._update(conn)

    def _read(self, conn: _Connection) -> None:
        server = self._server
        if not server.accepting_requests:
            self._update(conn)  # shutting down: drop the read interest, read nothing more
            return
        sock = conn.sock
        try:
            while not conn.muted and not conn.waiting_memory:
                if conn.size < 0:
                    n = sock.recv_into(memoryview(conn.head)[conn.head_read :])
                    if n == 0:
                        self._close(conn)
                        return
                    now = time.monotonic()
                    conn.last_active = now
                    if conn.head_read == 0:
                        conn.read_deadline = now + server.request_read_timeout_s
                    conn.head_read += n
                    if conn.head_read < 4:
                        if conn.tls:
                            continue  # OpenSSL may hold more: read until it wants more
                        return
                    conn.head_read = 0
                    (size,) = _SIZE.unpack(conn.head)
                    limit, key = server.max_request_size, "socket.request.max.bytes"
                    if conn.sasl and not server.authenticated(conn.connection_id):
                        # Before SASL authentication only small frames (Kafka's rule): an
                        # unknown client cannot make the broker buffer 100 MB.
                        limit, key = server.sasl_max_receive, "sasl.server.max.receive.size"
                    if size < 0 or size > limit:
                        server.bad_input.warning(
                            "oversize",
                            "closing %s: request size %d outside [0, %d] (%s)",
                            conn.connection_id,
                            size,
                            limit,
                            key,
                        )
                        self._close(conn)
                        return
                    if size == 0:
                        self._complete_frame(conn, b"", None)
                        if conn.closing:
                            return
                        continue
                    conn.size = size
                    conn.received = 0
                    conn.claim = Claim(conn.on_memory)
                body = conn.body
                if body is None or conn.received == len(body):
                    body = self._grow(conn)
                    if body is None:
                        return
                want = len(body) - conn.received
                n = sock.recv_into(memoryview(body)[conn.received :])
                if n == 0:
                    self._close(conn)
                    return
                conn.last_active = time.monotonic()
                conn.received += n
                if conn.received == conn.size:
                    # The buffer is exactly the frame (it never grows past the frame's size):
                    # hand it over as a read-only view, not a copy (kio insists on read-only
                    # input); the connection lets go of the buffer and its pool memory.
                    frame = memoryview(body).toreadonly()
                    claim = conn.claim
                    conn.body = None
                    conn.claim = None
                    conn.size = -1
                    self._complete_frame(conn, frame, claim)
                    if conn.closing:
                        return
                elif n < want and not conn.tls:
                    return  # the socket's receive buffer is empty: wait for the selector
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EPIPE, errno.ETIMEDOUT):
                log.debug("read error on %s: %s", conn.connection_id, exc)
            self._close(conn)

    def _grow(self, conn: _Connection) -> bytearray | None:
        """Make room for more of ``conn``'s frame: its buffer, grown within its claim.

        Returns None when nothing is to be read now: no byte of the frame has arrived (an
        announced frame takes no memory), the pool has put the claim in line (reading is
        muted until :meth:`memory_ready`), or the peer closed (``conn`` is closed).
        """
        claim = conn.claim
        assert claim is not None
        body = conn.body
        cap = 0 if body is None else len(body)
        if claim.held <= cap:
            arrived = self._arrived(conn.sock)
            if arrived < 0:
                self._close(conn)
                return None
            if arrived == 0:
                return None
            # Grow to what has arrived, but at least double (a trickling frame is not
            # copied over and over) and never past the frame: at most twice what was read.
            want = min(conn.size, max(_FIRST_PIECE, 2 * cap, cap + arrived))
            if not self._pool.reserve(claim, want - claim.held):
                pool = self._pool
                self._server.bad_input.info(
                    "memory-pool",
                    "request memory full (%d of %s bytes, queued.max.request.bytes):"
                    " connections wait to be read, %d in line",
                    pool.used,
                    pool.capacity,
                    pool.waiting,
                )
                conn.waiting_memory = True
                conn.wait_start = time.monotonic()
                self._update(conn)
                return None
        if body is None:
            body = conn.body = bytearray(claim.held)
        else:
            _bytearray_resize(body, claim.held)
        return body

    def _arrived(self, sock: socket.socket) -> int:
        """Bytes waiting in ``sock``'s receive buffer; -1 once the peer has closed.

        TLS: decrypted bytes OpenSSL holds plus the socket's (encrypted, so at least as
        many) bytes, and at least 1: end of stream shows only when read (``recv`` of an
        SSL socket takes no MSG_PEEK), which the caller then does."""
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, self._fionread, True)
        n = self._fionread[0]
        if isinstance(sock, ssl.SSLSocket):
            return max(1, n + sock.pending())
        if n > 0:
            return n
        try:
            # Nothing to read: distinguish "not yet" from end of stream (readable, 0 bytes).
            return 1 if sock.recv(1, socket.MSG_PEEK) else -1
        except (BlockingIOError, InterruptedError):
            return 0

    def _drain_memory_ready(self) -> None:
        now = 0.0
        ready = self._memory_ready
        while not ready.empty():
            conn = ready.get_nowait()
            if conn.closing or not conn.waiting_memory:
                continue
            if not now:
                now = time.monotonic()
            conn.waiting_memory = False
            conn.read_deadline += now - conn.wait_start
            self._update(conn)

    def _complete_frame(
        self, conn: _Connection, frame: bytes | memoryview, claim: Claim | None
    ) -> None:
        conn.muted = True
        req = NetworkRequest(
            self,
            conn.connection_id,
            conn.host,
            frame,
            time.monotonic_ns(),
            claim=claim,
            listener=conn.listener,
            principal=conn.principal,
        )
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
        responses = self._responses
        while not responses.empty():
            cid, parts = responses.get_nowait()
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
                    if conn.tls:
                        # No sendfile through TLS: the next bounded chunk goes out as bytes
                        # ahead of the rest of the region (module docstring, "TLS").
                        chunk = os.pread(part.fd, min(part.length, _TLS_CHUNK), part.position)
                        if not chunk:
                            log.error(
                                "segment shorter than the fetch region; closing %s",
                                conn.connection_id,
                            )
                            self._close(conn)
                            return
                        part.position += len(chunk)
                        part.length -= len(chunk)
                        q.appendleft(chunk)
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
                n = sock.send(part) if conn.tls else sock.send(part, _MSG_MORE if more else 0)
                if n < len(part):
                    q[0] = memoryview(part)[n:]
                    break
                q.popleft()
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
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
        self._tls_conns.pop(conn.connection_id, None)
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
        if conn.claim is not None:
            # A frame not yet whole: nobody else holds its memory (a whole one belongs to
            # its request, which gives it back when answered).
            self._pool.release(conn.claim)
            conn.claim = None
        conn.body = None
        self._server.connection_closed(conn.host)
        if self._server.on_close is not None:
            self._server.on_close(conn.connection_id)

    def _check_timeouts(self) -> None:
        """Close connections past their request deadline or idle for too long."""
        now = time.monotonic()
        server = self._server
        if now - self._last_timeout_check < server.timeout_check_interval_s:
            return
        self._last_timeout_check = now
        idle_limit = server.idle_timeout_s
        for conn in list(self._conns.values()):
            if conn.handshaking:
                if now > conn.read_deadline:
                    server.bad_input.warning(
                        "tls-timeout",
                        "closing %s: TLS handshake not finished within %d ms"
                        " (socket.request.read.timeout.ms)",
                        conn.connection_id,
                        round(server.request_read_timeout_s * 1000),
                    )
                    self._close(conn)
            elif conn.reading_frame():
                if conn.waiting_memory or not self._reading or now <= conn.read_deadline:
                    continue  # muted by the broker: the deadline waits too
                server.bad_input.warning(
                    "slow-request",
                    "closing %s: request not received whole within %d ms"
                    " (socket.request.read.timeout.ms; %d of %s bytes read)",
                    conn.connection_id,
                    round(server.request_read_timeout_s * 1000),
                    conn.received if conn.size >= 0 else conn.head_read,
                    conn.size if conn.size >= 0 else "?",
                )
                self._close(conn)
            elif not conn.muted and not conn.send_queue and now - conn.last_active > idle_limit:
                log.debug("closing idle %s (connections.max.idle.ms)", conn.connection_id)
                self._close(conn)

    def idle(self) -> bool:
        """True when nothing is pending, in flight or waiting to be written."""
        return not self._pending and all(
            not c.muted and not c.send_queue for c in self._conns.values()
        )


@functools.cache
def tune_allocator() -> bool:
    """Set glibc's malloc thresholds for request-sized buffers (module docstring,
    "Allocator"); once per process. False (nothing done) on another C library."""
    try:
        os.confstr("CS_GNU_LIBC_VERSION")
        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    )
