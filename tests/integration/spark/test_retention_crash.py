"""The offline retention job killed (SIGKILL) midway leaves a consistent log dir.

A log dir of real logs (``LogManager`` + ``Log.append``, timestamps a day old, small
segments) is trimmed offline by the job in a subprocess, killed at several points after it
starts deleting. After each kill the log dir is opened by the broker's own ``LogManager``
(recovery): every partition's segments are a suffix of the original ones, byte for byte, its
log end offset is unchanged and its log start offset lies in its first segment. A final run to
completion then gives exactly the uninterrupted result.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logstore.protocol.records import build_batch
from logstore.storage.config import LogConfig
from logstore.storage.log_manager import LogManager

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OLD = int(time.time() * 1000) - 86_400_000
CFG = LogConfig(segment_bytes=1200, retention_ms=3_600_000, file_delete_delay_ms=50)
PARTITIONS = 60

RUN = """
import sys
from pipelines.retention.job import RetentionConfig, run_retention
cfg = RetentionConfig(log_dirs=(sys.argv[1],), lake=sys.argv[2], broker_config=sys.argv[3])
s = run_retention(None, cfg, force=True, log=lambda m: print(m, flush=True))
print("DONE", s.deleted_segments, len(s.errors), flush=True)
"""


def _snapshot(log_dir: Path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    for part in sorted(p for p in log_dir.iterdir() if p.is_dir() and "-" in p.name):
        out[part.name] = {f.name: f.read_bytes() for f in sorted(part.glob("*.log"))}
    return out


def _deleting(log_dir: Path, original: dict[str, dict[str, bytes]]) -> bool:
    for name, files in original.items():
        names = os.listdir(log_dir / name)
        if any(n.endswith(".deleted") for n in names) or sum(
            n.endswith(".log") for n in names
        ) < len(files):
            return True
    return False


def _check_consistent(log_dir: Path, original: dict[str, dict[str, bytes]]) -> int:
    """Open with the broker's LogManager, check every partition; return segments left."""
    mgr = LogManager(log_dir, default_config=CFG, background=False)
    left = 0
    try:
        for log in mgr.all_logs():
            name = log.dir.name
            if name not in original:
                continue
            files = [f"{s.base_offset:020d}.log" for s in log.segments]
            orig = list(original[name])
            assert files == orig[len(orig) - len(files) :], name  # a suffix
            for f in files[:-1]:
                assert (log.dir / f).read_bytes() == original[name][f], (name, f)
            first = log.segments[0].base_offset
            nxt = log.segments[1].base_offset if len(log.segments) > 1 else log.log_end_offset
            assert first <= log.log_start_offset <= nxt, name
            assert not list(log.dir.glob("*.deleted"))
            left += len(files)
    finally:
        mgr.shutdown()
    return left


def test_killed_offline_job_leaves_a_consistent_log_dir(tmp_path: Path) -> None:
    log_dir = tmp_path / "logs"
    with LogManager(log_dir, default_config=CFG, background=False) as mgr:
        for p in range(PARTITIONS):
            lg = mgr.get_or_create_log("crash", p)
            for i in range(40):
                lg.append(build_batch([(b"k", b"v" * 100)] * 2, base_timestamp=OLD + i))
            lg.high_watermark = lg.log_end_offset
    original = _snapshot(log_dir)
    total = sum(len(v) for v in original.values())
    props = tmp_path / "broker.properties"
    props.write_text(
        "log.retention.hours=1\nlog.segment.bytes=1200\nlog.segment.delete.delay.ms=50\n"
    )
    args = [sys.executable, "-c", RUN, str(log_dir), str(tmp_path / "lake"), str(props)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    kills = 0
    for delay in (0.0, 0.005, 0.02, 0.05):
        current = _snapshot(log_dir)
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("deleting below"):
                # kill once the first segments went (renamed .deleted or removed), then later
                while proc.poll() is None and not _deleting(log_dir, current):
                    time.sleep(0.001)
                time.sleep(delay)
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(60)
        kills += proc.returncode == -signal.SIGKILL
        left = _check_consistent(log_dir, original)
        assert PARTITIONS <= left <= total
    assert kills >= 2  # killed midway, not finished
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    assert done.stdout.splitlines()[-1].split()[2] == "0"  # no errors
    assert _check_consistent(log_dir, original) == PARTITIONS  # only active segments left
    shutil.rmtree(tmp_path / "lake", ignore_errors=True)
