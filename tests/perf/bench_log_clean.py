"""Benchmark: one log cleaning pass of one partition (plan, key map, rewrite, offline swap).

Writes ``--records`` records of ~100 B over ``--keys`` keys in batches of ``--batch``
(``--codec``) through ``Log.append`` into 8 MiB segments, then times
:func:`pipelines.compaction.log.clean_partition` (plan + key map with the reference model +
rewrite of every group) and :func:`hand_over` (validation + swap under the ``.lock``), and, as
the baseline, a plain Python dict dedupe of the same records already decoded (what one
cleaner thread's key map costs). Records/s for each; last line one JSON object. No Spark: the
job runs this once per partition on an executor.

    .venv/bin/python tests/perf/bench_log_clean.py [--records 200000] [--keys 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from logstore.protocol.batch import Codec
from logstore.protocol.records import build_batch
from logstore.storage.cleaner import iter_segment_records, plan_cleaning
from logstore.storage.config import LogConfig
from logstore.storage.log import Log
from logstore.storage.topic_config import write_topic_config
from pipelines.compaction.log import _settings, clean_partition, hand_over


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--codec", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    args = parser.parse_args()
    codec = Codec[args.codec.upper()]
    rnd = random.Random(1)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        log_dir = Path(tmp)
        props = {"cleanup.policy": "compact", "segment.bytes": str(8 << 20)}
        write_topic_config(log_dir, "bench", props)
        d = log_dir / "bench-0"
        log = Log.open(d, LogConfig.from_properties(props))
        value = os.urandom(90)
        ts = 1_700_000_000_000
        for start in range(0, args.records, args.batch):
            items = [
                (b"key-%08d" % rnd.randrange(args.keys), value, [], ts)
                for _ in range(min(args.batch, args.records - start))
            ]
            log.append(build_batch(items, codec=codec))
        leo = log.log_end_offset
        log.roll()
        log.close()
        size = sum(p.stat().st_size for p in d.glob("*.log"))

        t0 = time.perf_counter()
        res = clean_partition(d, force=True, high_watermark=leo)
        t1 = time.perf_counter()
        swapped, _ = hand_over(d)
        t2 = time.perf_counter()
        assert swapped and res.records_in == args.records, res

        # baseline: the dict dedupe alone over already decoded records (one cleaner thread)
        _, settings = _settings(log_dir, "bench")
        plan = plan_cleaning(d, settings, high_watermark=leo)
        records = list(iter_segment_records(d, plan.segments))
        t3 = time.perf_counter()
        latest: dict[bytes | None, int] = {}
        for r in records:
            latest[r.key] = r.offset
        t4 = time.perf_counter()

    out = {
        "records": args.records,
        "keys": args.keys,
        "codec": args.codec,
        "log_mib": round(size / 2**20, 1),
        "records_out": res.records_out,
        "clean_s": round(t1 - t0, 2),
        "swap_s": round(t2 - t1, 3),
        "clean_records_per_s": round(args.records / (t1 - t0)),
        "dict_dedupe_records_per_s": round(args.records / (t4 - t3)),
    }
    print(
        f"clean {out['clean_records_per_s']:,} records/s ({out['clean_s']} s for "
        f"{out['log_mib']} MiB), swap {out['swap_s']} s; dict dedupe of decoded records "
        f"{out['dict_dedupe_records_per_s']:,} records/s"
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
