"""``[storage]`` of conf/pipeline.toml: typed like every section (unknown keys refused naming
the nearest, ranges checked before Spark starts, exit 2), the same keys as
``logstore.objectstore``'s settings, laid over the AWS environment, and installed by the job
runner as the run's settings for every lake call, then removed when the run ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from logstore.objectstore import OVERRIDE_KEYS, LakeLocation, StorageSettings, delta_target
from pipelines.config import SECTIONS, read_pipeline_toml, storage_settings
from pipelines.jobrun import run_job
from tests.fixtures.jobs import load_job


def test_the_section_holds_exactly_the_store_settings() -> None:
    spec = SECTIONS["storage"]
    assert isinstance(spec, dict)
    assert {*spec, "options"} == set(OVERRIDE_KEYS)
    assert "storage.options" in SECTIONS


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[storage]\nendpoint = "http://h:1"\n',
         "unknown key 'endpoint' in [storage]; did you mean 'endpoint_url'?"),
        ('[storage]\nendpoint_url = "h:9000"\n', "expected an http:// or https:// URL"),
        ("[storage]\nmax_attempts = 0\n", "max_attempts = 0: expected an integer in 1..20"),
        ('[storage]\nallow_http = "yes"\n', "[storage] allow_http = \"yes\": expected a boolean"),
        # in the section's range but refused by the store's own rule (0 < t)
        ("[storage]\nconnect_timeout_s = 0\n", "storage connect_timeout_s must be in (0, 300]"),
        ("[storage.options]\nazure_storage_account_key = \"\"\n", "expected a non-empty string"),
    ],
)  # fmt: skip
def test_a_bad_storage_section_exits_2_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    conf = tmp_path / "pipeline.toml"
    conf.write_text(text)
    assert load_job("ingest").main(["--config", str(conf), "--lake", str(tmp_path / "lake")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ingest failed: ") and message in err, err
    assert str(conf) in err
    assert not (tmp_path / "lake").exists()


def test_section_over_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://env.example:443")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    conf = tmp_path / "pipeline.toml"
    conf.write_text(
        '[storage]\nendpoint_url = "http://127.0.0.1:9000"\nmax_attempts = 7\n'
        '[storage.options]\nfoo = "bar"\n'
    )
    got = storage_settings(read_pipeline_toml(conf), conf)
    assert (got.endpoint_url, got.allow_http) == ("http://127.0.0.1:9000", True)
    assert got.max_attempts == 7
    assert (got.access_key_id, got.region) == ("env-key", "eu-west-1")  # the rest: environment
    options = got.delta_options(LakeLocation.parse("s3://b/lake"))
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["foo"] == "bar"


def test_the_runner_installs_the_runs_settings_and_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name, raising=False)
    conf = tmp_path / "pipeline.toml"
    conf.write_text('[storage]\nendpoint_url = "http://127.0.0.1:9"\naccess_key_id = "k"\n')
    seen: list[tuple[StorageSettings, dict[str, str]]] = []

    def body() -> int:
        # what a lake call given no settings uses during the run
        seen.append((StorageSettings.default(), delta_target("s3://b/lake/records")[1]))
        return 0

    assert run_job("probe", str(conf), body) == 0
    settings, options = seen[0]
    assert settings.endpoint_url == "http://127.0.0.1:9" and settings.access_key_id == "k"
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9"
    assert options["AWS_ACCESS_KEY_ID"] == "k"
    after = StorageSettings.default()  # the run is over: the environment's again
    assert after.endpoint_url is None and after.access_key_id is None

    def failing() -> int:
        raise OSError("store down")

    assert run_job("probe", str(conf), failing) == 1
    assert StorageSettings.default().endpoint_url is None
