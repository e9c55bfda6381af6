"""``[retention]`` in the pipeline TOML: the shipped file loads, unknown keys and bad values are
refused with the file named, and broker defaults come out as the broker derives them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from pipelines.retention.job import broker_defaults, load_retention_config, parse_records_retention

ROOT = Path(__file__).resolve().parents[4]


def test_shipped_config_loads() -> None:
    cfg = load_retention_config(ROOT / "conf" / "pipeline.toml")
    assert cfg.records_retention == "forever"
    assert cfg.vacuum_hours == 168
    assert cfg.zorder is False
    assert cfg.delete_records_chunk == 1000
    assert Path(cfg.broker_config) == Path("conf/broker.properties")
    # conf/broker.properties sets no retention: Kafka's 168 hours, no size limit
    defaults = broker_defaults(str(ROOT / cfg.broker_config))
    assert (defaults.retention_ms, defaults.retention_bytes) == (168 * 3_600_000, -1)


def _toml(tmp_path: Path, retention: str) -> Path:
    p = tmp_path / "p.toml"
    p.write_text(f'[paths]\nlog_dirs = ["/x"]\nlake = "/y"\n[retention]\n{retention}\n')
    return p


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("vacum_hours = 1", "unknown key 'vacum_hours' in [retention]"),
        ('records = "30 days"', "records"),
        ('records = "0d"', "records"),
        ("vacuum_hours = -1", "vacuum_hours = -1: expected a number >= 0"),
        ("delete_records_chunk = 0", "delete_records_chunk = 0: expected an integer >= 1"),
        ('delete_records_chunk = "5"', 'delete_records_chunk = "5": expected an integer, got'),
        ('vacuum_hours = "x"', 'vacuum_hours = "x": expected a number'),
    ],
)
def test_bad_retention_settings_are_refused(tmp_path: Path, line: str, message: str) -> None:
    p = _toml(tmp_path, line)
    with pytest.raises(LoglakeError, match=re.escape(message)) as exc:
        load_retention_config(p)
    assert str(p) in str(exc.value)


def test_records_retention_values() -> None:
    assert parse_records_retention("forever") == "forever"
    assert parse_records_retention(" topic ") == "topic"
    assert parse_records_retention("30d") == 30 * 86_400_000
    assert parse_records_retention("12h") == 12 * 3_600_000
    assert parse_records_retention("90m") == 90 * 60_000
    for bad in ("", "d", "-1d", "1w", "1.5d"):
        with pytest.raises(ValueError, match="expected forever, topic or an age"):
            parse_records_retention(bad)


def test_broker_defaults_units(tmp_path: Path) -> None:
    p = tmp_path / "b.properties"
    p.write_text("log.retention.hours=5\nlog.retention.minutes=7\nlog.retention.bytes=1000\n")
    d = broker_defaults(str(p))
    assert (d.retention_ms, d.retention_bytes) == (7 * 60_000, 1000)  # the finer unit wins


def test_delete_records_chunk(tmp_path: Path) -> None:
    assert (
        load_retention_config(_toml(tmp_path, "delete_records_chunk = 2")).delete_records_chunk == 2
    )
