"""State machine: append / roll / truncate / flush / crash / recover on a real Log.

The model is the list of batches (offsets and exact bytes) a correct log must hold. A crash
copies the partition directory while the log is still open — what a SIGKILL leaves: page cache
contents, untrimmed preallocated indexes — optionally chops bytes off the active segment's tail
and drops index files, then reopens (recovery). The recovered log must equal the last whole
batches written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from logstore.protocol.batch import iter_batches
from logstore.protocol.records import build_batch
from logstore.storage.log import Log, LogConfig

CFG = LogConfig(
    segment_bytes=1500,
    index_interval_bytes=100,
    segment_index_bytes=8 * 12,  # small: "index full" rolls happen too
)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="logmachine-"))
        self.generation = 0
        self.log = Log.open(self._dir(), CFG)
        # (base_offset, last_offset, bytes) of every batch the log must hold, in order
        self.model: list[tuple[int, int, bytes]] = []
        self.next_offset = 0

    def _dir(self) -> Path:
        return self.tmp / f"gen{self.generation}" / "t-0"

    def teardown(self) -> None:
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(
        sizes=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 300)), min_size=1, max_size=3),
        ts=st.integers(0, 10**12),
    )
    def append(self, sizes: list[tuple[int, int]], ts: int) -> None:
        buf = bytearray()
        for n, size in sizes:
            buf += build_batch([(b"k", b"x" * size)] * n, base_timestamp=ts)
        info = self.log.append(buf)
        assert info.first_offset == self.next_offset
        for pos, h in iter_batches(buf):
            self.model.append((h.base_offset, h.last_offset, bytes(buf[pos : pos + h.size])))
        self.next_offset = info.last_offset + 1

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.model) - 1))
        target = self.model[i][0]
        assert self.log.truncate_to(target)
        del self.model[i:]
        self.next_offset = target

    @rule(chop=st.integers(0, 400), drop_index=st.booleans(), drop_time_index=st.booleans())
    def crash(self, chop: int, drop_index: bool, drop_time_index: bool) -> None:
        old_dir = self._dir()
        recovery_point = self.log.recovery_point
        self.generation += 1
        new_dir = self._dir()
        shutil.copytree(old_dir, new_dir)  # SIGKILL: the page cache survives, nothing else
        active_base = self.log.active_segment.base_offset
        self.log.close()
        active = new_dir / f"{active_base:020d}.log"
        size = active.stat().st_size
        chop = min(chop, size)
        if chop:
            os.truncate(active, size - chop)
            # batches of the active segment that no longer fit are lost
            kept_end = size - chop
            pos = 0
            keep: list[tuple[int, int, bytes]] = []
            for entry in self.model:
                if entry[0] < active_base:
                    keep.append(entry)
                    continue
                pos += len(entry[2])
                if pos <= kept_end:
                    keep.append(entry)
            self.model = keep
            in_active = [e for e in keep if e[0] >= active_base]
            self.next_offset = in_active[-1][1] + 1 if in_active else active_base
        if drop_index:
            (new_dir / f"{active_base:020d}.index").unlink()
        if drop_time_index:
            for p in sorted(new_dir.glob("*.timeindex"))[:1]:
                p.unlink()
        self.log = Log.open(new_dir, CFG, recovery_point=recovery_point)

    @rule()
    def clean_restart(self) -> None:
        self.log.close()
        self.log = Log.open(self._dir(), CFG, clean_shutdown=True)

    @invariant()
    def holds_exactly_the_model(self) -> None:
        got: list[tuple[int, int, bytes]] = []
        for seg in self.log.segments:
            data = seg.path.read_bytes()
            assert len(data) == seg.size
            got += [
                (h.base_offset, h.last_offset, data[p : p + h.size]) for p, h in iter_batches(data)
            ]
        assert got == self.model
        assert self.log.log_end_offset == self.next_offset
        for seg in self.log.segments:
            seg.offset_index.sanity_check(log_size=seg.size)
            seg.time_index.sanity_check()

    @invariant()
    def reads_find_every_batch(self) -> None:
        for base, last, raw in self.model[-5:]:
            for off in {base, last}:
                fs = self.log.read(off, 1)
                assert fs.first_offset == base
                assert os.pread(fs.fileno, fs.length, fs.position) == raw


LogMachine.TestCase.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)
TestLogMachine = LogMachine.TestCase
