"""jobs/quality.py on tables made by the real ingest: suites pass, broken tables fail by name.

The log dir: a real broker with confluent-kafka producing ``orders`` (2 partitions, lz4 and
zstd, tombstones, null keys), then, after the broker stopped, a partition ``txn-0`` written by
the storage engine with what clients cannot make against this broker: a transaction and its
COMMIT marker (a control batch) and a batch the log cleaner left with holes in its offset range.
Ingest and lookups run for real; the results are read back with deltalake.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from logstore.protocol.control import ControlType, build_control_batch
from logstore.protocol.records import Record, build_batch
from logstore.storage.checkpoints import read_offset_checkpoint, write_offset_checkpoint
from pipelines.ingest import IngestConfig, read_progress, run_ingest
from pipelines.lookups import build_lookups
from pipelines.sources.synthetic import write_batches
from tests.fixtures.broker import BrokerProcess
from tests.fixtures.jobs import load_job

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
NOW_MS = int(time.time() * 1000)


def _produce(bootstrap: str) -> None:
    admin_errors: list[Any] = []
    for codec in ("lz4", "zstd"):
        p = ck.Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                         "linger.ms": 5})  # fmt: skip
        for i in range(30):
            p.produce("orders", partition=i % 2, key=None if i % 5 == 0 else f"k{i % 7}",
                      value=None if i % 9 == 4 else f"{codec}-{i}".encode() * 3,
                      on_delivery=lambda err, _m: err and admin_errors.append(err))  # fmt: skip
        assert p.flush(60) == 0
    assert not admin_errors


def _txn_partition(log_dir: Path) -> None:
    """txn-0: offsets 0-2 a transaction, 3 its COMMIT marker, 4-7 a cleaned batch holding 4, 6."""
    pid = dict(producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True)
    ts = NOW_MS - 10 * 86_400_000  # ten days old
    _, end = write_batches(
        log_dir, "txn", 0,
        [build_batch([(b"k", b"v", [], ts)] * 3, **pid),
         build_control_batch(ControlType.COMMIT, producer_id=7, producer_epoch=0, timestamp=ts)],
    )  # fmt: skip
    assert end == 4
    # What the cleaner leaves: the batch keeps its offset range 4-7 but holds 4 and 6 only.
    # The storage engine appends producer batches only, so it goes to the segment directly.
    cleaned = build_batch(
        [Record(offset=4, key=b"a", value=b"x", timestamp=ts),
         Record(offset=6, key=b"b", value=b"y", timestamp=ts)],
        base_offset=4, keep_offsets=True, last_offset_delta=3,
    )  # fmt: skip
    with (log_dir / "txn-0" / "00000000000000000000.log").open("ab") as f:
        f.write(cleaned)
    end = 8
    hw_file = log_dir / "replication-offset-checkpoint"
    write_offset_checkpoint(hw_file, {**read_offset_checkpoint(hw_file), ("txn", 0): end})


@pytest.fixture(scope="module")
def lake(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(log dir, lake) after a real ingest and lookups run."""
    work = tmp_path_factory.mktemp("quality")
    broker = BrokerProcess(work / "broker", num_partitions=2)
    broker.start()
    try:
        _produce(broker.bootstrap)
    finally:
        assert broker.stop() == 0
    _txn_partition(broker.log_dir)
    lake = work / "lake"
    config = IngestConfig(log_dirs=(str(broker.log_dir),), lake=str(lake), progress_interval_s=0)
    assert run_ingest(spark, config, log=lambda _m: None).records == 65
    build_lookups(spark, log_dirs=config.log_dirs, lake=str(lake))
    return broker.log_dir, lake


def _config(path: Path, log_dir: Path, lake: Path, quality: str = "") -> Path:
    path.write_text(f'[paths]\nlog_dirs = ["{log_dir}"]\nlake = "{lake}"\n[quality]\n{quality}')
    return path


def _results(lake: Path, run_id: str) -> dict[tuple[str, str], dict[str, Any]]:
    t = DeltaTable(str(lake / "quality_results")).to_pyarrow_table()
    rows = t.filter(pc.equal(t["run_id"], run_id)).to_pylist()
    return {(r["suite"], r["rule"]): r for r in rows}


def test_suites_pass_on_the_ingested_tables(
    lake: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, root = lake
    config = _config(tmp_path / "p.toml", log_dir, root)
    assert load_job("quality").main(["--config", str(config), "--run-id", "good"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["success"] is True and summary["failed"] == []
    assert summary["suites"] == {
        "records": True, "records_gaps": True, "lookups": True, "quarantine": True,
    }  # fmt: skip
    assert (root / "_quality" / "data_docs" / "index.html").is_file()
    assert summary["docs"] == str(root / "_quality" / "data_docs" / "index.html")
    results = _results(root, "good")
    assert all(r["success"] for r in results.values())
    assert {"offset_unique", "gaps_explained", "codec_in_domain", "timestamp_within_skew",
            "offset_below_high_watermark", "lookup_first_offset_agrees",
            "quarantine_under_threshold"} <= {rule for _, rule in results}  # fmt: skip
    assert results[("records", "offset_unique")]["expectation"] == (
        "expect_compound_columns_to_be_unique"
    )
    assert results[("quarantine", "quarantine_under_threshold")]["observed_value"] == "0"


def test_gaps_are_classified(spark: Any, lake: tuple[Path, Path]) -> None:
    from pipelines.delta import read_app_transactions, read_delta
    from pipelines.quality.bounds import partition_bounds
    from pipelines.quality.checks import bounds_frame, lookup_progress_frame, offset_gaps

    log_dir, root = lake
    bounds = bounds_frame(spark, partition_bounds([str(log_dir)], read_progress(root / "records")))
    gaps = offset_gaps(
        read_delta(spark, root / "records"), bounds, read_delta(spark, root / "offset_lookup"),
        None, lookup_progress_frame(spark, read_app_transactions(root / "offset_lookup")),
    )  # fmt: skip
    got = sorted((r.gap, r.explanation, r.offsets) for r in gaps.collect())
    assert got == [
        ("txn/0 [3, 4)", "transaction_marker", 1),
        ("txn/0 [5, 6)", "compaction", 1),
        ("txn/0 [7, 8)", "compaction", 1),
    ]


def test_a_broken_table_fails_the_right_expectations(
    lake: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, good = lake
    root = tmp_path / "lake"
    shutil.copytree(good, root)
    records = DeltaTable(str(root / "records"))
    t = records.to_pyarrow_table()
    orders0 = pc.and_(pc.equal(t["topic"], "orders"), pc.equal(t["partition"], 0))
    dupes = t.filter(pc.and_(orders0, pc.is_in(t["offset"], pa.array([1, 2], pa.int64()))))
    assert dupes.num_rows == 2
    write_deltalake(str(root / "records"), dupes, mode="append", partition_by=["topic", "date"])
    records = DeltaTable(str(root / "records"))
    records.delete('topic = \'orders\' AND "partition" = 0 AND "offset" = 10')
    config = _config(tmp_path / "p.toml", log_dir, root, "max_past_skew_s = 86400\n")

    assert load_job("quality").main(["--config", str(config), "--run-id", "broken"]) == 5
    out = capsys.readouterr()
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert sorted(summary["failed"]) == [
        "records.offset_unique", "records.timestamp_within_skew", "records_gaps.gaps_explained",
    ]  # fmt: skip
    assert "expectations failed: " in out.err
    results = _results(root, "broken")
    failed = {key for key, r in results.items() if not r["success"]}
    assert failed == {
        ("records", "offset_unique"), ("records", "timestamp_within_skew"),
        ("records_gaps", "gaps_explained"),
    }  # fmt: skip
    assert results[("records", "offset_unique")]["unexpected_count"] == 4  # both copies of 2
    assert "unexplained" in results[("records_gaps", "gaps_explained")]["details"]
    # the txn records (ten days old) only are past the one-day bound
    assert results[("records", "timestamp_within_skew")]["unexpected_count"] == 5


def _latest_per_key(lake: Path) -> dict[tuple[int, bytes], tuple[int, bool]]:
    """(partition, key) -> (latest offset, latest is a tombstone) of ``orders``, in Python."""
    rows = DeltaTable(str(lake / "records")).to_pyarrow_table().to_pylist()
    latest: dict[tuple[int, bytes], tuple[int, bool]] = {}
    for r in rows:
        if r["topic"] == "orders" and r["key"] is not None:
            k = (r["partition"], r["key"])
            if k not in latest or r["offset"] > latest[k][0]:
                latest[k] = (r["offset"], r["value"] is None)
    return latest


def test_a_compacted_topic_table_is_checked(
    lake: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir, good = lake
    root = tmp_path / "lake"
    shutil.copytree(good, root)
    latest = _latest_per_key(root)
    live = sorted((p, k, o) for (p, k), (o, tomb) in latest.items() if not tomb)
    dead = sorted((p, k, o) for (p, k), (o, tomb) in latest.items() if tomb)
    assert live and dead  # the produced data has both

    def table(rows: list[tuple[int, bytes, int]]) -> pa.Table:
        p, k, o = zip(*rows, strict=True)
        return pa.table({"partition": pa.array(p, pa.int32()), "key": pa.array(k, pa.binary()),
                         "offset": pa.array(o, pa.int64())})  # fmt: skip

    write_deltalake(str(root / "topics" / "orders"), table(live))
    config = _config(tmp_path / "p.toml", log_dir, root)
    assert load_job("quality").main(["--config", str(config), "--run-id", "compacted"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["suites"]["topic_orders"] is True

    stale = (live[0][0], live[0][1], live[0][2] - 1)  # an older offset of a live key
    broken = [*live[1:], stale, live[1], dead[0]]  # ... a key twice, a tombstoned key
    write_deltalake(str(root / "topics" / "orders"), table(broken), mode="overwrite")
    assert load_job("quality").main(["--config", str(config), "--run-id", "compacted-broken"]) == 5
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(summary["failed"]) == [
        "topic_orders.key_unique_per_partition", "topic_orders.no_tombstoned_key",
        "topic_orders.offset_is_latest",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def actions_run(
    lake: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[dict[str, Any]]]:
    """(lake, what the user's Action recorded) of one quality run on a copy of the lake with
    no quality history, a user Action given in [quality] actions."""
    log_dir, good = lake
    work = tmp_path_factory.mktemp("actions")
    root = work / "lake"
    shutil.copytree(good, root, ignore=shutil.ignore_patterns("_quality", "quality_results"))
    out = work / "recorded.jsonl"
    config = _config(
        work / "p.toml", log_dir, root,
        f'[[quality.actions]]\nclass = "tests.fixtures.quality_actions.RecordingAction"\n'
        f'out = "{out}"\n',
    )  # fmt: skip
    assert load_job("quality").main(["--config", str(config), "--run-id", "actions"]) == 0
    return root, [json.loads(line) for line in out.read_text().splitlines()]


SUITES = ["records", "records_gaps", "lookups", "quarantine"]


def test_checkpoint_actions_write_the_results_and_docs_and_run_the_users(
    actions_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, recorded = actions_run
    # one Checkpoint run per suite, the user's Action last, after loglake's two
    assert [next(iter(r["suites"])) for r in recorded] == SUITES
    results = _results(root, "actions")
    for line in recorded:
        (suite, success), = line["suites"].items()  # fmt: skip
        assert line["run_name"] == "actions" and success is True
        docs, rows = line["before"]
        assert [docs["type"], rows["type"]] == ["loglake_data_docs", "loglake_quality_results"]
        # the rows of quality_results are the ones the results Action wrote
        assert rows["result"] == {
            "table": str(root / "quality_results"),
            "rows": sum(1 for s, _ in results if s == suite),
        }
        # and the page the Data Docs Action built is there
        (page,) = (url for urls in docs["result"].values() for url in urls.values())
        assert page.startswith("file://") and f"/validations/{suite}/actions/" in page
        assert Path(page.removeprefix("file://")).is_file()
    assert {s for s, _ in results} == set(SUITES) and all(r["success"] for r in results.values())
    stored = json.loads((root / "_quality" / "gx" / "checkpoints" / "loglake_records.json")
                        .read_text())  # fmt: skip
    assert [a["type"] for a in stored["actions"]] == [
        "loglake_data_docs", "loglake_quality_results", "test_recording",
    ]  # fmt: skip


_PAGE_STATE = """(async () => {
  await document.fonts.ready;
  const rows = id => Array.from(document.querySelectorAll(`#${id} tbody tr`))
    .map(r => r.innerText.replace(/\\s+/g, ' ').trim());
  const icon = document.querySelector('.fas');
  return {
    validations: rows('section-1-content-block-2-1-body-table'),
    suites: rows('section-1-content-block-2-2-body-table'),
    text: document.body.innerText,
    font: getComputedStyle(document.body).fontFamily,
    icon_font: icon ? getComputedStyle(icon, '::before').fontFamily : null,
    icon_font_loaded: document.fonts.check('900 16px "Font Awesome 6 Free"'),
  };
})()"""


def test_data_docs_render_offline_in_chromium(
    actions_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    from tests.fixtures.browser import open_offline

    root, _ = actions_run
    site = root / "_quality" / "data_docs"
    ready = "document.readyState === 'complete'"
    index = open_offline((site / "index.html").as_uri(), ready=ready, script=_PAGE_STATE)
    assert index.network_requests == [] and index.failed == [] and index.console_errors == []
    state = index.value
    # bootstrap-table drew the lists (JavaScript ran): every run and suite is listed
    # (a row: run time, run name, asset, batch, suite)
    assert sorted(v.split(" UTC ", 1)[1] for v in state["validations"]) == sorted(
        f"actions {s} loglake-{s} {s}" for s in SUITES
    )
    assert sorted(state["suites"]) == sorted(SUITES)
    # Bootstrap's CSS is applied (its font stack, not the browser's default serif), and Font
    # Awesome's icons have their web font
    assert state["font"].startswith("-apple-system")
    assert state["icon_font"] == '"Font Awesome 6 Free"' and state["icon_font_loaded"] is True

    (page,) = (site / "validations" / "records" / "actions").rglob("*.html")
    shown = open_offline(page.as_uri(), ready=ready, script=_PAGE_STATE)
    assert shown.network_requests == [] and shown.failed == [] and shown.console_errors == []
    assert shown.value["font"].startswith("-apple-system")
    assert "Expectation Suite: records" in shown.value["text"]
    assert "(topic, partition, offset) is unique: no record twice" in shown.value["text"]


def test_a_user_action_taken_out_of_the_config_is_gone_next_run(
    lake: tuple[Path, Path], actions_run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The stored Checkpoints name the last run's Actions; a class no longer configured (and
    so not imported) must not stop the next run."""
    log_dir, _ = lake
    root = tmp_path / "lake"
    shutil.copytree(actions_run[0], root)
    config = _config(tmp_path / "p.toml", log_dir, root)
    assert load_job("quality").main(["--config", str(config), "--run-id", "again"]) == 0
    stored = json.loads((root / "_quality" / "gx" / "checkpoints" / "loglake_records.json")
                        .read_text())  # fmt: skip
    types = [a["type"] for a in stored["actions"]]
    assert types == ["loglake_data_docs", "loglake_quality_results"]
    assert {s for s, _ in _results(root, "again")} == set(SUITES)
