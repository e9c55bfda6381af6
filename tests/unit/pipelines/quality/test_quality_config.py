"""[quality] of conf/pipeline.toml: defaults, the shipped file, refused keys and values."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.errors import LoglakeError
from pipelines.quality.config import QualityConfig, load_quality_config

ROOT = Path(__file__).resolve().parents[4]


def test_the_shipped_config_reads() -> None:
    config = load_quality_config(ROOT / "conf" / "pipeline.toml")
    assert config == QualityConfig(max_future_skew_s=3600.0, max_quarantined_batches=0)


def test_absent_section_is_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('[paths]\nlake = "/x"\n')
    assert load_quality_config(path) == QualityConfig()


def test_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        "[quality]\nmax_future_skew_s = 5\nmax_past_skew_s = 60.5\n"
        "max_quarantined_batches = 3\ndocs = false\n"
    )
    assert load_quality_config(path) == QualityConfig(5.0, 60.5, 3, False)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "max_futur_skew_s = 1",
            "unknown key 'max_futur_skew_s' in \\[quality\\]; did you mean 'max_future_skew_s'",
        ),
        ("colour = 1", "unknown key 'colour' in \\[quality\\]"),
        ("max_future_skew_s = -1", "max_future_skew_s = -1: expected a number >= 0"),
        ("max_past_skew_s = 'x'", 'max_past_skew_s = "x": expected a number, got a string'),
        ("max_quarantined_batches = 1.5", "max_quarantined_batches = 1.5: expected an integer"),
        ("docs = 1", "docs = 1: expected a boolean"),
    ],
)
def test_bad_keys_and_values_are_refused(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[quality]\n{body}\n")
    with pytest.raises(LoglakeError, match=message.replace("(", r"\(")) as info:
        load_quality_config(path)
    assert str(path) in str(info.value)
