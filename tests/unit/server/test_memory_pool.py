"""MemoryPool: reservations within the capacity, first come first served, the one overdraw
grant (progress when pieces of many frames fill the pool; a frame larger than the pool),
release from any thread, and the bound ``used <= capacity + the grant's claim``."""

from __future__ import annotations

import random
import threading

import pytest

from logstore.server.memory_pool import Claim, MemoryPool


class _Ready:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def claim(self, name: str) -> Claim:
        return Claim(lambda: self.calls.append(name))


def test_reservations_within_capacity_and_release():
    pool = MemoryPool(100)
    a, b = Claim(), Claim()
    assert pool.reserve(a, 60)
    assert pool.reserve(b, 40)
    assert (pool.used, a.held, b.held) == (100, 60, 40)
    assert not a.granted and not b.granted
    pool.release(a)
    assert (pool.used, a.held) == (40, 0)
    pool.release(a)  # idempotent
    pool.release(b)
    assert pool.used == 0


def test_a_claim_that_does_not_fit_gets_the_grant_when_nobody_waits():
    pool = MemoryPool(100)
    small, big = Claim(), Claim()
    assert pool.reserve(small, 90)
    assert pool.reserve(big, 50)  # does not fit: overdraws with the grant
    assert big.granted and pool.grant_held
    assert pool.used == 140
    assert pool.reserve(big, 1000)  # the grant's claim always gets more at once
    assert pool.used == 1140
    pool.release(big)
    assert not big.granted and not pool.grant_held
    assert pool.used == 90


def test_frame_larger_than_the_whole_pool_is_served():
    pool = MemoryPool(10)
    c = Claim()
    assert pool.reserve(c, 4)
    assert pool.reserve(c, 1_000_000)
    assert c.held == 1_000_004 and c.granted
    pool.release(c)
    assert pool.used == 0


def test_line_is_first_come_first_served_and_served_on_release():
    r = _Ready()
    pool = MemoryPool(100)
    first, grantee = Claim(), Claim()
    assert pool.reserve(first, 100)
    assert pool.reserve(grantee, 10)  # the grant
    big, small = r.claim("big"), r.claim("small")
    assert not pool.reserve(big, 80)
    # 'small' would not fit either; even a claim that would fit queues behind 'big'
    assert not pool.reserve(small, 1)
    assert pool.waiting == 2 and r.calls == []
    pool.release(grantee)  # frees the grant: the head of the line takes it and overdraws
    assert r.calls == ["big"]
    assert big.granted and big.held == 80 and big.waiting == 0
    assert pool.used == 180
    pool.release(first)  # 80 used (big); small fits now
    assert r.calls == ["big", "small"]
    assert small.held == 1 and not small.granted
    assert pool.waiting == 0


def test_later_claims_queue_behind_a_waiting_one_even_if_they_fit():
    r = _Ready()
    pool = MemoryPool(100)
    holder, grantee = Claim(), Claim()
    assert pool.reserve(holder, 50)
    assert pool.reserve(grantee, 60)  # 110 > 100: the grant
    big = r.claim("big")
    assert not pool.reserve(big, 60)
    late = r.claim("late")
    assert not pool.reserve(late, 10)  # big is in line before it
    pool.release(holder)  # 60 used: big needs 60 -> 120 > 100 and the grant is taken
    assert r.calls == []
    pool.release(grantee)  # 0 used: big (60) and late (10) both fit, in order
    assert r.calls == ["big", "late"]
    assert not big.granted


def test_released_waiting_claim_leaves_the_line():
    r = _Ready()
    pool = MemoryPool(10)
    a, b = Claim(), Claim()
    assert pool.reserve(a, 10)
    assert pool.reserve(b, 10)  # grant
    gone = r.claim("gone")
    nxt = r.claim("next")
    assert not pool.reserve(gone, 5)
    assert not pool.reserve(nxt, 5)
    pool.release(gone)  # its connection closed while waiting
    assert pool.waiting == 1 and gone.held == 0 and gone.waiting == 0
    pool.release(b)  # the grant comes back: the (new) head of the line takes it
    assert r.calls == ["next"]
    assert nxt.granted and nxt.held == 5
    pool.release(a)
    pool.release(nxt)
    assert pool.used == 0


def test_reserving_while_waiting_is_refused():
    pool = MemoryPool(10)
    a, b, c = Claim(), Claim(), Claim()
    assert pool.reserve(a, 10)
    assert pool.reserve(b, 1)
    assert not pool.reserve(c, 1)
    with pytest.raises(RuntimeError):
        pool.reserve(c, 1)
    with pytest.raises(ValueError):
        pool.reserve(Claim(), 0)
    with pytest.raises(ValueError):
        MemoryPool(0)


def test_unbounded_pool_only_counts():
    pool = MemoryPool(None)
    c = Claim()
    assert pool.reserve(c, 10**12)
    assert not c.granted and pool.used == 10**12
    pool.release(c)
    assert pool.used == 0


def test_pieces_of_many_frames_never_deadlock_and_stay_bounded():
    """Frames reserved in pieces, in random order, from threads; a frame is released once
    whole (its request answered). Every frame completes, and at every moment the claims
    without the grant hold at most the capacity."""
    capacity, frame_max = 1000, 700
    pool = MemoryPool(capacity)
    rng = random.Random(7)
    frames = [rng.randint(1, frame_max) for _ in range(300)]
    lock = threading.Lock()
    done = threading.Semaphore(0)
    violations: list[str] = []

    def check() -> None:
        with pool._lock:  # a consistent view: the pool changes claims under its lock
            used = pool.used
            granted = sum(c.held for c in live if c.granted)
        if used - granted > capacity:
            violations.append(f"used {used}, grant {granted}")

    def release(claim: Claim) -> None:
        pool.release(claim)
        with lock:
            live.remove(claim)
        done.release()

    live: list[Claim] = []

    def step(claim: Claim, size: int) -> None:
        # the next piece of this frame, or its release once whole (from a timer thread,
        # as handlers release)
        with lock:
            check()
            if claim.held >= size:
                threading.Thread(target=release, args=(claim,)).start()
                return
            piece = min(size - claim.held, rng.randint(1, 200))
        if pool.reserve(claim, piece):
            step(claim, size)

    for size in frames:
        claim = Claim()
        with lock:
            live.append(claim)
        claim.on_ready = lambda c=claim, s=size: threading.Thread(target=step, args=(c, s)).start()
        threading.Thread(target=step, args=(claim, size)).start()
    for _ in frames:
        assert done.acquire(timeout=30), "a frame never completed: deadlock"
    assert violations == []
    assert pool.used == 0 and pool.waiting == 0 and not pool.grant_held
