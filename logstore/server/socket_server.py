"""The broker's sockets and threads: listening sockets, acceptor, request channel, handlers.

The shape and the rules are in :mod:`logstore.server.network` (the reactor's docstring:
acceptor, processors, request memory, listeners, TLS, shutdown); this module owns the
listening sockets (one per client listener, with its TLS context), the acceptor thread that
hands connections round-robin to the :class:`~logstore.server.network.Processor` s, the
bounded request channel and the handler threads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Final

from logstore.server.config import BrokerConfig, Listener
from logstore.server.memory_pool import MemoryPool
from logstore.server.network import NetworkRequest, Processor, RateLimitedLog, tune_allocator
from logstore.server.security.tls import build_server_context

__all__ = ["SocketServer"]

log = logging.getLogger("logstore.server.network")

# Connections accepted per wake-up of the acceptor at most (then the processors are woken).
_ACCEPT_BATCH: Final = 256


class SocketServer:
    """Listening socket, acceptor, processors, request channel and handler threads.

    ``dispatch(request)`` runs on a handler thread and must eventually call
    ``request.respond(parts)`` or ``request.close()`` (directly or from a deferred
    completion); an exception out of ``dispatch`` closes the connection.

    ``inline(request) -> bool``, when given, runs on the processor thread first: True means
    it has taken the request with the same duty as ``dispatch`` (and must not have blocked),
    False sends the request on to the handlers. An exception out of it closes the connection.
    ``on_close(connection_id)``, when given, is called on the processor thread after each
    connection closes (per-connection state elsewhere, e.g. SASL sessions, is dropped).
    """

    def __init__(
        self,
        config: BrokerConfig,
        dispatch: Callable[[NetworkRequest], None],
        *,
        inline: Callable[[NetworkRequest], bool] | None = None,
        on_close: Callable[[str], None] | None = None,
        authenticated: Callable[[str], bool] | None = None,
    ) -> None:
        self._config = config
        self.on_close = on_close  # called with the connection id of every closed connection
        self._dispatch = dispatch
        self._inline = inline
        self.max_request_size = config.get_int("socket.request.max.bytes")
        # SASL listeners: frames of connections not yet authenticated are bounded by
        # sasl.server.max.receive.size; ``authenticated(connection_id)`` says which are.
        self.sasl_listeners = frozenset(config.sasl)
        self.sasl_max_receive = config.get_int("sasl.server.max.receive.size")
        self.authenticated: Callable[[str], bool] = authenticated or (lambda _cid: True)
        self.max_connections = config.get_int("max.connections")
        self.max_connections_per_ip = config.get_int("max.connections.per.ip")
        self.idle_timeout_s = config.get_int("connections.max.idle.ms") / 1000.0
        self.request_read_timeout_s = config.get_int("socket.request.read.timeout.ms") / 1000.0
        # Deadlines are checked this often: a second, or finer for short (test) timeouts.
        self.timeout_check_interval_s = max(
            0.01, min(1.0, self.idle_timeout_s / 4, self.request_read_timeout_s / 4)
        )
        pool_bytes = config.get_int("queued.max.request.bytes")
        # <= 0: no bound, as in Kafka (MemoryPool.NONE); the pool then only counts.
        self.memory_pool = MemoryPool(pool_bytes if pool_bytes > 0 else None)
        self.bad_input = RateLimitedLog(log)
        self.accepting_requests = True
        self._channel: queue.Queue[NetworkRequest | None] = queue.Queue(
            maxsize=config.get_int("queued.max.requests")
        )
        self._conn_lock = threading.Lock()
        self._conn_count = 0
        self._conns_per_ip: dict[str, int] = {}
        self._ids = itertools.count()
        # One listening socket per client listener, each with its TLS context or None.
        self._listens: list[tuple[socket.socket, Listener, ssl.SSLContext | None]] = []
        # listener name -> (host, port) actually bound (port 0 in the config: the OS's)
        self.bound: dict[str, tuple[str, int]] = {}
        # listener name -> ssl.principal.mapping.rules of its client certificates
        self.principal_rules = {name: tls.principal_rules for name, tls in config.tls.items()}
        try:
            for listener in config.listeners:
                settings = config.tls.get(listener.name)
                ctx = build_server_context(settings) if settings is not None else None
                lsock = self._bind(listener, config.get_int("socket.listen.backlog.size"))
                self._listens.append((lsock, listener, ctx))
                self.bound[listener.name] = lsock.getsockname()[:2]
        except BaseException:
            for lsock, _, _ in self._listens:
                lsock.close()
            raise
        self.host, self.port = self.bound[config.listener.name]
        self._processors = [
            Processor(self, i) for i in range(config.get_int("num.network.threads"))
        ]
        self._handlers = [
            threading.Thread(target=self._handler_loop, name=f"loglake-io-{i}", daemon=True)
            for i in range(config.get_int("num.io.threads"))
        ]
        self._rr = itertools.cycle(self._processors)
        self._acceptor = threading.Thread(
            target=self._accept_loop, name="loglake-acceptor", daemon=True
        )
        self._stopping = threading.Event()
        self._inflight = 0
        self._inflight_lock = threading.Condition()

    @staticmethod
    def _bind(listener: Listener, backlog: int) -> socket.socket:
        lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            lsock.bind((listener.host or "0.0.0.0", listener.port))
        except OSError as exc:
            lsock.close()
            raise OSError(
                exc.errno,
                f"cannot listen on {listener.host}:{listener.port} ({listener.name}): {exc}",
            ) from exc
        lsock.listen(backlog)
        return lsock

    def start(self) -> None:
        tune_allocator()
        for p in self._processors:
            p.start()
        for h in self._handlers:
            h.start()
        self._acceptor.start()

    # -- acceptor ----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        sel = selectors.DefaultSelector()
        for entry in self._listens:
            entry[0].setblocking(False)
            sel.register(entry[0], selectors.EVENT_READ, entry)
        try:
            while not self._stopping.is_set():
                woken: set[Processor] = set()
                for key, _ in sel.select(0.2):
                    self._accept_batch(key.data, woken)
                for proc in woken:
                    proc.wakeup()
        finally:
            sel.close()

    def _accept_batch(
        self,
        entry: tuple[socket.socket, Listener, ssl.SSLContext | None],
        woken: set[Processor],
    ) -> None:
        """Everything waiting in one listener's accept queue; the processors it fed are
        added to ``woken`` and woken once by the caller: a select() and a wake-up per
        connection cannot keep up with a burst."""
        lsock, listener, ctx = entry
        send_buf = self._config.get_int("socket.send.buffer.bytes")
        recv_buf = self._config.get_int("socket.receive.buffer.bytes")
        bound_host, bound_port = self.bound[listener.name]
        local = f"{bound_host}:{bound_port}"
        for _ in range(_ACCEPT_BATCH):
            try:
                sock, addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if self._stopping.is_set():
                    return
                # EMFILE/ENFILE/ENOBUFS: the connection stays queued; try again soon.
                self.bad_input.warning("accept", "accept failed: %s", exc)
                time.sleep(0.05)
                break
            host = addr[0]
            refused = self._admit(host)
            if refused is not None:
                self.bad_input.warning(
                    refused.partition("=")[0],
                    "refusing connection from %s: %s",
                    host,
                    refused,
                )
                sock.close()
                continue
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if send_buf > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buf)
                if recv_buf > 0:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buf)
            except OSError:  # reset before we got to it
                sock.close()
                self.connection_closed(host)
                continue
            cid = f"{local}-{host}:{addr[1]}-{next(self._ids)}"
            proc = next(self._rr)
            proc.add_connection(sock, cid, host, listener=listener.name, tls=ctx, wake=False)
            woken.add(proc)

    def _admit(self, host: str) -> str | None:
        """Count a new connection from ``host``; why not, if it is over a limit."""
        with self._conn_lock:
            if self._conn_count >= self.max_connections:
                return f"max.connections={self.max_connections} reached"
            per_ip = self._conns_per_ip.get(host, 0)
            if per_ip >= self.max_connections_per_ip:
                return f"max.connections.per.ip={self.max_connections_per_ip} reached"
            self._conn_count += 1
            self._conns_per_ip[host] = per_ip + 1
        return None

    def connection_closed(self, host: str) -> None:
        with self._conn_lock:
            self._conn_count -= 1
            left = self._conns_per_ip.get(host, 0) - 1
            if left > 0:
                self._conns_per_ip[host] = left
            else:
                self._conns_per_ip.pop(host, None)

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
        for lsock, _, _ in self._listens:
            with contextlib.suppress(OSError):
                lsock.close()
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
