"""jobs/build_lookups.py: Delta tables written, read back with deltalake, incremental re-runs."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from logstore.protocol.records import build_batch
from pipelines.decode.reference import reference_decode
from pipelines.sources.synthetic import write_batches

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


def load_job() -> Any:
    spec = importlib.util.spec_from_file_location(
        "build_lookups_job", ROOT / "jobs" / "build_lookups.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def batches(start: int, n: int) -> list[bytearray]:
    return [
        build_batch([(b"k", b"v" * i, [], 1_700_000_000_000 + (start + i) * 10) for i in range(3)])
        for _ in range(n)
    ]


def expected_rows(log_dir: Path) -> list[tuple[str, int, int, int, int]]:
    out = []
    for part in sorted(log_dir.glob("*-*")):
        topic, _, p = part.name.rpartition("-")
        for seg in sorted(part.glob("*.log")):
            data = seg.read_bytes()
            rows, _, _ = reference_decode(data)
            positions = sorted({r["batch_position"] for r in rows})
            for pos in positions:
                offs = [r["offset"] for r in rows if r["batch_position"] == pos]
                out.append((topic, int(p), pos, min(offs), max(offs)))
    return sorted(out)


def test_build_lookups_job_is_incremental(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, lake = tmp_path / "logs", tmp_path / "lake"
    write_batches(log_dir, "a", 0, batches(0, 30), segment_bytes=2000, index_interval_bytes=200)
    write_batches(log_dir, "b", 3, batches(0, 5))
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n')
    job = load_job()

    assert job.main(["--config", str(config)]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert first["rows"] == {"offset_lookup": 35, "time_lookup": 35}
    assert first["index_problems"] == 0
    table = DeltaTable(str(lake / "offset_lookup")).to_pyarrow_table()
    got = sorted(
        zip(
            *(
                table.column(c).to_pylist()
                for c in ["topic", "partition", "position", "first_offset", "last_offset"]
            ),
            strict=True,
        )
    )
    assert got == expected_rows(log_dir)

    assert job.main(["--config", str(config)]) == 0  # nothing new: no-op
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["rows"] == {"offset_lookup": 0, "time_lookup": 0}

    write_batches(log_dir, "a", 0, batches(100, 4), segment_bytes=2000, index_interval_bytes=200)
    assert job.main(["--config", str(config)]) == 0
    third = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert third["rows"] == {"offset_lookup": 4, "time_lookup": 4}
    assert third["progress"]["offset_lookup"] == {"offset_lookup:a-0": 102}
    times = DeltaTable(str(lake / "time_lookup")).to_pyarrow_table()
    assert times.num_rows == 39
    assert sorted(times.column("first_offset").to_pylist()) == sorted(
        [r[3] for r in expected_rows(log_dir)]
    )
