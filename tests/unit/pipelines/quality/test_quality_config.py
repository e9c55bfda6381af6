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


def test_user_actions_are_read(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[[quality.actions]]\nclass = "my.alerts:Page"\nchannel = "#data"\n'
        '[[quality.actions]]\nclass = "my.alerts.Mail"\nname = "mail"\n'
    )
    assert load_quality_config(path).actions == (
        {"class": "my.alerts:Page", "channel": "#data"},
        {"class": "my.alerts.Mail", "name": "mail"},
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("actions = 'x'", 'actions = "x": expected a list, got a string'),
        ("actions = [1]", "actions = \\[1\\]: expected a list of tables; 1 is not one"),
        ("actions = [{name = 'x'}]", "actions\\[0\\] needs class ="),
        ("actions = [{class = 'NoModule'}]", "actions\\[0\\] needs class ="),
        ("actions = [{class = 'a.B', type = 'x'}]", "type is the class's own"),
    ],
)
def test_bad_actions_are_refused(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(f"[quality]\n{body}\n")
    with pytest.raises(LoglakeError, match=message) as info:
        load_quality_config(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"class": "tests.no_such_module.Action"}, "cannot import 'tests.no_such_module.Action'"),
        ({"class": "pathlib.Path"}, "is not a great_expectations ValidationAction subclass"),
        ({"class": "tests.fixtures.quality_actions:RecordingAction"}, "refused its fields"),
    ],
)
def test_user_actions_that_cannot_be_made_are_refused(spec: dict[str, str], message: str) -> None:
    from pipelines.quality.actions import user_actions

    with pytest.raises(LoglakeError, match=message):
        user_actions([spec])


def test_a_user_action_is_made_with_its_fields(tmp_path: Path) -> None:
    from pipelines.quality.actions import user_actions

    (action,) = user_actions(
        [{"class": "tests.fixtures.quality_actions:RecordingAction", "out": str(tmp_path)}]
    )
    assert (type(action).__name__, action.name, action.out) == (  # type: ignore[attr-defined]
        "RecordingAction", "RecordingAction", str(tmp_path),
    )  # fmt: skip
