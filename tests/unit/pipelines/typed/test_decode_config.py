"""jobs/decode.py before Spark: ``[decode]`` checked with the rest of the file (exit 2, naming
the key), no registry configured (exit 0, nothing decoded, no Spark), the registry client's
errors; and the wire format's header parse on edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipelines.typed.config import DecodeConfig
from pipelines.typed.registry import RegisteredSchema, RegistryClient, RegistryError
from pipelines.typed.upsert import tombstones_path
from pipelines.typed.wire import Decoders, decode_column
from tests.fixtures.broker import free_port
from tests.fixtures.jobs import load_job


def _conf(tmp_path: Path, decode: str) -> str:
    path = tmp_path / "pipeline.toml"
    path.write_text(f'[paths]\nlake = "{tmp_path / "lake"}"\n[decode]\n{decode}', encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('on_error = "skip"', '[decode] on_error = "skip": expected one of dead_letter, fail'),
        ('schema_registry_url = "localhost:8081"', "an http:// or https:// URL"),
        ("max_dead_letter_rate = 2", "in 0..1"),
        ('on_eror = "fail"', "did you mean 'on_error'"),
    ],
)
def test_bad_decode_settings_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    assert load_job("decode").main(["--config", _conf(tmp_path, line)]) == 2
    assert message in capsys.readouterr().err


def test_cdc_order_must_be_offset_or_a_field_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = _conf(tmp_path, '[decode.cdc]\ncustomers = "source..lsn"\n')
    assert load_job("decode").main(["--config", conf]) == 2
    assert "offset, or a field path of the envelope" in capsys.readouterr().err


def test_no_registry_decodes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert load_job("decode").main(["--config", _conf(tmp_path, "")]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out.splitlines()[-1]) == {"topics": []}
    assert "schema_registry_url is not set" in out.err
    assert not (tmp_path / "lake").exists()


def test_a_registry_that_does_not_answer_is_a_registry_error() -> None:
    client = RegistryClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(RegistryError, match="/schemas/ids/7"):
        client.by_id(7)
    with pytest.raises(Exception, match="expected http"):
        RegistryClient("ftp://x")


def test_headers_of_every_shape() -> None:
    class NoRegistry:
        def by_id(self, schema_id: int) -> RegisteredSchema:
            raise AssertionError("no schema id should be looked up")

    reader = RegisteredSchema("AVRO", '{"type":"record","name":"R","fields":[]}')
    decoders = Decoders(NoRegistry(), reader)  # type: ignore[arg-type]
    data = pa.array(
        [b"", b"\x00", b"\x01\x00\x00\x00\x01x", b"\x00\x00\x00\x00", None, b"\xff"], pa.binary()
    )
    out = decode_column(data.slice(0), decoders)
    assert out.values.null_count == 6 and out.schema_ids.null_count == 6
    assert out.errors.to_pylist() == [
        "truncated: 0 bytes, shorter than the 5-byte header",
        "truncated: 1 bytes, shorter than the 5-byte header",
        "no magic byte: first byte is 0x01, not 0x00",
        "truncated: 4 bytes, shorter than the 5-byte header",
        "null value",
        "no magic byte: first byte is 0xff, not 0x00",
    ]
    sliced = decode_column(data.slice(2, 1), decoders)
    assert sliced.errors.to_pylist() == ["no magic byte: first byte is 0x01, not 0x00"]


@pytest.mark.parametrize("lake", ["s3://bucket/lake", "/srv/lake"])
def test_the_decode_tables_are_under_the_lake_on_an_object_store_too(lake: str) -> None:
    """The tables' locations are joined as lake URIs: ``Path`` would turn ``s3://b`` into
    ``s3:/b`` (a relative local path), and the job would write beside the lake, not in it."""
    config = DecodeConfig(lake=lake, registry_url="http://127.0.0.1:1")
    assert config.records_path == f"{lake}/records"
    assert config.dead_letters_path == f"{lake}/dead_letters"
    assert config.table_path("orders") == f"{lake}/tables/orders"
    assert tombstones_path(lake, "orders") == f"{lake}/table_tombstones/orders"
