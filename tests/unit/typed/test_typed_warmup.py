"""The setup's warm-up (``python -m pipelines.decode.warmup``, run by tools/bootstrap.sh)
compiles the typed tables' Avro and Protobuf kernels too, so the first decode job after
``make setup`` loads machine code instead of compiling it in every Spark worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_warm_up_fills_numbas_cache_with_the_avro_kernel(tmp_path: Path) -> None:
    # A cache of its own: the kernels are compiled from nothing, and what the warm-up left is
    # exactly what is found there.
    env = os.environ | {"NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.decode.warmup"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "8 Avro values decoded" in done.stderr
    assert "4 Protobuf values decoded" in done.stderr
    assert "4 typed rows written" in done.stderr
    cached = {p.name.split("-")[0] for p in tmp_path.rglob("*.nbi")}
    assert {
        "avro_kernel.decode_rows",
        "protobuf_kernel.decode_rows",
        "_kernels.records_to_columns",
        "_parquet_kernels.plain_binary",
        "_parquet_kernels.levels",  # the typed tables' nested columns
        "_parquet_kernels.dictionary_fixed",
    } <= cached, cached
