"""jobs/compact.py --log with no broker: the job finds the compacted topic by its topic config,
cleans it on Spark and swaps it in itself under the log dir's .lock; the log then equals the
reference model, the cleaner-offset-checkpoint is written, a second run is a no-op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.compact import main
from logstore.protocol.batch import Codec
from logstore.storage.checkpoints import write_offset_checkpoint
from logstore.storage.cleaner import read_cleaner_checkpoint
from logstore.storage.dirlock import DirLock
from pipelines.compaction.model import Strategy
from tests.unit.storage.test_cleaner import expected_after, read_log, write_log

ROOT = Path(__file__).resolve().parents[3]


def _args(log_dir: Path) -> list[str]:
    conf = str(ROOT / "conf" / "pipeline.toml")
    return ["--config", conf, "--log-dirs", str(log_dir), "--lake", str(log_dir / "lake"), "--log"]


def _fields(records):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in records]


def test_job_cleans_offline_and_equals_the_model(tmp_path: Path, spark, capsys) -> None:
    batches = [
        ([(i % 4, None if i % 9 == 4 else b"v%d" % i, None) for i in range(j, j + 4)], c, 7)
        for j, c in ((k, [Codec.GZIP, Codec.NONE][k % 2]) for k in range(0, 80, 4))
    ]
    d = write_log(tmp_path, batches, segment_bytes=300)
    before, headers = read_log(d)
    leo = headers[-1].next_offset
    # no broker: the high watermark a broker would have checkpointed
    write_offset_checkpoint(tmp_path / "replication-offset-checkpoint", {("t", 0): leo})
    assert main(_args(tmp_path)) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (res,) = out
    assert res["swapped"] is True and res["note"] == "swapped offline"
    assert res["end_offset"] == leo
    after, _ = read_log(d)
    assert _fields(after) == expected_after(before, leo, Strategy(), expired=set())
    assert read_cleaner_checkpoint(tmp_path) == {("t", 0): leo}
    lock = DirLock(tmp_path)
    lock.acquire()  # released by the job
    lock.release()
    # nothing dirty any more: not due, nothing rewritten
    assert main(_args(tmp_path)) == 0
    (again,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["due"] is False and again["groups"] == 0
    assert _fields(read_log(d)[0]) == _fields(after)


def test_job_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "--log" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
