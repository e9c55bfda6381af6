"""The broker's bounded request memory: Kafka's ``queued.max.request.bytes`` (KIP-72).

Every byte of a request frame the processors buffer — while it is being received, while it
waits in the request channel and while a handler works on it — is drawn from one
:class:`MemoryPool` and given back when the request is answered (or its connection closes
first). A frame's memory is a :class:`Claim`; the processor grows a frame's receive buffer
as bytes arrive and reserves each growth from the pool first, so a client that only
announces a large frame holds nothing.

Kafka's ``SimpleMemoryPool`` hands out a whole frame's buffer at once and lets the one
allocation that finds the pool not yet empty overdraw it. Reserving a frame in pieces needs
two more rules, or pieces of many frames could fill the pool with none of them whole and
nothing ever released (a deadlock):

1. **First come, first served.** A reservation that does not fit waits in line; while
   anyone waits, later reservations queue behind them even if they would fit, so a big
   frame is never starved by a stream of small ones. Released memory goes to the head of
   the line (the pool reserves it on the waiter's behalf and calls its ``on_ready``).
2. **One overdraw grant.** When the head of the line does not fit and nobody holds the
   grant, its claim gets the grant: this and all later reservations of that claim succeed
   at once, whatever the pool holds, so that frame can always be received whole. The grant
   is given back with the claim's memory (:meth:`MemoryPool.release`), and only then can
   another claim get it. This is also what serves a single frame larger than the whole
   pool (a ``socket.request.max.bytes`` above ``queued.max.request.bytes``): it waits for
   the grant, then overdraws, as Kafka's one overdrawing allocation does.

What always holds: claims without the grant hold at most ``capacity`` bytes together, so
``used <= capacity + held by the grant's claim <= capacity + socket.request.max.bytes``.

A capacity of ``None`` (``queued.max.request.bytes`` <= 0, Kafka's "no limit") reserves
everything at once and never queues; the pool then only counts.

Thread-safety: every method may be called from any thread (processors reserve, handlers
release). ``on_ready`` callbacks run outside the pool's lock, on the thread that released
the memory; they must not block.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

__all__ = ["Claim", "MemoryPool"]


class Claim:
    """The pool memory held for one request frame.

    ``held``: bytes reserved (the frame's receive buffer may use up to this much).
    ``waiting``: bytes asked for and not yet given (0 when not in line).
    ``granted``: this claim holds the pool's overdraw grant.
    Read them only from the thread that owns the frame; the pool changes them under its lock.
    """

    __slots__ = ("granted", "held", "on_ready", "waiting")

    def __init__(self, on_ready: Callable[[], None] | None = None) -> None:
        self.held = 0
        self.waiting = 0
        self.granted = False
        self.on_ready = on_ready


class MemoryPool:
    """A byte budget shared by all processors; see the module docstring for the rules."""

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity <= 0:
            raise ValueError(f"memory pool capacity must be positive or None, got {capacity}")
        self._capacity = capacity
        self._used = 0
        self._lock = threading.Lock()
        self._line: collections.deque[Claim] = collections.deque()
        self._grantee: Claim | None = None

    @property
    def capacity(self) -> int | None:
        return self._capacity

    @property
    def used(self) -> int:
        """Bytes reserved by all claims (may exceed ``capacity`` by the grant's claim)."""
        return self._used

    @property
    def waiting(self) -> int:
        """Claims in line for memory."""
        return len(self._line)

    @property
    def grant_held(self) -> bool:
        return self._grantee is not None

    def reserve(self, claim: Claim, n: int) -> bool:
        """Add ``n`` bytes to ``claim`` now (True), or put it in line for them (False).

        After False the claim must not reserve again until its ``on_ready`` has been
        called (the ``n`` bytes are then in ``claim.held``) or it has been released.
        """
        if n <= 0:
            raise ValueError(f"reserve needs a positive size, got {n}")
        with self._lock:
            if claim.waiting:
                raise RuntimeError("claim is already waiting for memory")
            cap = self._capacity
            if cap is None or claim.granted or (not self._line and self._used + n <= cap):
                claim.held += n
                self._used += n
                return True
            if not self._line and self._grantee is None:
                # nobody waits, and it does not fit: overdraw (the grant) rather than wait
                self._grant(claim)
                self._take(claim, n)
                return True
            claim.waiting = n
            self._line.append(claim)
            return False

    def release(self, claim: Claim) -> None:
        """Give back everything ``claim`` holds (and its grant); leave the line if in it.

        Idempotent: releasing a claim twice gives nothing back the second time.
        """
        with self._lock:
            if claim.waiting:
                self._line.remove(claim)
                claim.waiting = 0
            self._used -= claim.held
            claim.held = 0
            if claim.granted:
                claim.granted = False
                self._grantee = None
            if not self._line:
                return
            ready = self._serve_line()
        for on_ready in ready:
            on_ready()

    # -- under the lock ----------------------------------------------------------------

    def _take(self, claim: Claim, n: int) -> None:
        claim.held += n
        self._used += n

    def _grant(self, claim: Claim) -> None:
        claim.granted = True
        self._grantee = claim

    def _serve_line(self) -> list[Callable[[], None]]:
        """Reserve for the head of the line while it fits or the grant is free."""
        ready: list[Callable[[], None]] = []
        cap = self._capacity
        line = self._line
        while line:
            claim = line[0]
            n = claim.waiting
            if cap is not None and self._used + n > cap:
                if self._grantee is not None:
                    break
                self._grant(claim)
            line.popleft()
            claim.waiting = 0
            self._take(claim, n)
            if claim.on_ready is not None:
                ready.append(claim.on_ready)
        return ready
