"""The generated Avro kernel (``pipelines.typed.avro_codegen``) decodes exactly as the
interpreter (``avro_kernel``): the same rows, the same errors *and positions*, on random
schemas, evolutions and damaged payloads; its on-disk cache refuses what it must not import;
``kernel="auto"`` switches to it when it pays.

Each generated kernel is a numba compilation (seconds), so the random cases are few; the
hand-written schema below reaches every instruction the compiler emits (skips of writer-only
records, arrays, maps and enums, a union read as a struct, an unreadable branch, decimals on
bytes and fixed, promotions, a reader-only field with a default).
"""

from __future__ import annotations

import decimal
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pipelines.typed import avro, avro_codegen
from pipelines.typed.avro import compile_decoder
from tests.fixtures.tmpfs import fill
from tests.unit.typed.avro_strategies import values_of, with_evolution
from tests.unit.typed.test_avro_property import frame

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        {"name": "street", "type": "string"},
        {"name": "zip", "type": ["null", "string"]},
    ],
}
WRITER = {
    "type": "record",
    "name": "Everything",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "small", "type": "int"},
        {"name": "ratio", "type": "float"},
        {"name": "price", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "name", "type": "string"},
        {"name": "blob", "type": "bytes"},
        {"name": "nothing", "type": "null"},
        {"name": "hash", "type": {"type": "fixed", "name": "H4", "size": 4}},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {
            "name": "big",
            "type": {
                "type": "fixed",
                "name": "D16",
                "size": 16,
                "logicalType": "decimal",
                "precision": 38,
                "scale": 0,
            },
        },
        {"name": "colour", "type": {"type": "enum", "name": "C", "symbols": ["R", "G", "B"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "homes", "type": {"type": "array", "items": ADDRESS}},
        {"name": "scores", "type": {"type": "map", "values": ["null", "double"]}},
        {"name": "either", "type": ["null", "long", "string", "H4"]},
        {"name": "nested", "type": {"type": "array", "items": {"type": "array", "items": "int"}}},
        {"name": "gone", "type": ADDRESS | {"name": "Gone"}},
        {"name": "gone_list", "type": {"type": "array", "items": "long"}},
        {"name": "gone_map", "type": {"type": "map", "values": "string"}},
        {"name": "gone_enum", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
        {"name": "odd", "type": ["int", "boolean"]},
    ],
}
# Reads WRITER: drops the gone_* fields, promotes small and ratio, adds a field with a
# default, drops a symbol (with a reader default), cannot read `odd`'s boolean branch.
PROMOTED = {"small": "double", "ratio": "double"}
RED = {"default": "R"}
READER = {
    "type": "record",
    "name": "Everything",
    "fields": [
        *(
            {"name": f["name"], "type": PROMOTED.get(f["name"], f["type"])}
            for f in WRITER["fields"]
            if not f["name"].startswith("gone") and f["name"] not in ("colour", "odd")
        ),
        {"name": "colour", "type": {"type": "enum", "name": "C", "symbols": ["R", "G"]} | RED},
        {"name": "odd", "type": "long"},
        {"name": "added", "type": "string", "default": "new"},
    ],
}  # fmt: skip


def record(i: int) -> dict[str, Any]:
    """A value of WRITER: every field, varied by ``i`` (nulls, empty and multi-block-free
    lists, negative and large numbers, non-ASCII text)."""
    address = {"street": f"{i} rue de l'été", "zip": None if i % 3 else f"{i:05d}"}
    return {
        "id": (-1) ** i * 7 ** (i % 22), "small": i - 20, "ratio": i / 3, "price": -i * 1e10,
        "ok": i % 2 == 0, "name": "ñ" * (i % 4) + "x" * i, "blob": bytes(range(i % 7)),
        "nothing": None, "hash": bytes([i, 0, 255, 1]),
        "amount": decimal.Decimal((-1) ** i * i * 12345).scaleb(-2),
        "big": decimal.Decimal(10**37 + i), "colour": "RGB"[i % 3],
        "tags": [f"t{j}" for j in range(i % 5)], "homes": [address] * (i % 3),
        "scores": {f"k{j}": None if j % 2 else j / 7 for j in range(i % 4)},
        "either": [None, i, str(i), bytes([i, i, i, i])][i % 4],
        "nested": [[j] * j for j in range(i % 3)], "gone": address,
        "gone_list": list(range(i % 6)), "gone_map": {"a": str(i)} if i % 2 else {},
        "gone_enum": "XY"[i % 2], "odd": i,
    }  # fmt: skip


def assert_identical(a: avro.Decoded, b: avro.Decoded) -> None:
    """The same errors (positions included) and the same Arrow buffers, byte for byte (damaged
    payloads decode to NaNs and to dates Python cannot hold: values cannot be compared)."""
    assert a.values.type == b.values.type
    assert a.errors.to_pylist() == b.errors.to_pylist()
    assert [x and x.to_pybytes() for x in a.values.buffers()] == [
        x and x.to_pybytes() for x in b.values.buffers()
    ]


def damage(raw: list[bytes]) -> list[bytes]:
    """Every payload cut at every length, plus each with one byte flipped to 0xff/0x80."""
    out = []
    for r in raw:
        out.extend(r[:n] for n in range(len(r)))
        for i in range(5, len(r), 3):
            for b in (0xFF, 0x80, 0x01):
                out.append(r[:i] + bytes([b]) + r[i + 1 :])
    return out


@pytest.fixture
def kernel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOGLAKE_CACHE_DIR", str(tmp_path))
    return tmp_path / "avro-kernels"


def test_every_instruction_decodes_as_the_interpreter(kernel_cache: Path) -> None:
    records = [record(i) for i in range(40)]
    records[0]["homes"] = [{"street": f"s{i}", "zip": None} for i in range(300)]  # arenas grow
    records[1]["either"] = "text"
    records[2]["either"] = b"\x01\x02\x03\x04"
    records[3]["odd"] = True  # the reader cannot read this branch: an error of this row
    good = frame(WRITER, records).to_pylist()
    values = pa.array(good + damage(good[4:8]) + [None, b"", b"\x00"], pa.binary())
    for reader in (json.dumps(READER),):
        gen = compile_decoder(json.dumps(WRITER), reader, kernel="generated")
        interp = compile_decoder(json.dumps(WRITER), reader, kernel="interpreter")
        assert gen.kernel == "generated" and gen._generated is not None
        got, want = gen.decode(values), interp.decode(values)
        assert_identical(got, want)
        assert want.error_count > 100  # the damaged ones (and the unreadable branch)
        assert got.values[0].as_py()["homes"][299] == {"street": "s299", "zip": None}
        assert "cannot be read" in got.errors[3].as_py()
        assert got.values[5].as_py()["added"] == "new"
    assert len(list(kernel_cache.glob("loglake_avro_*.py"))) == 1


def _zigzag(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), b""
    while z >= 0x80:
        out += bytes([z & 0x7F | 0x80])
        z >>= 7
    return out + bytes([z])


def test_decimals_and_text_at_the_edges_decode_as_the_interpreter(kernel_cache: Path) -> None:
    """The generated kernel's in-line paths (decimals of 1-8 bytes against the precision's
    bounds, the ASCII loop before the UTF-8 check) against the interpreter and the values:
    +-(10^p - 1) decode, +-10^p are errors, at every width from 1 to 10 bytes (sign-extended,
    so 9 and 10 take the call), for bytes and fixed decimals of 4, 18 and 19 digits."""
    schema = {
        "type": "record",
        "name": "Edges",
        "fields": [
            {"name": "p4", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4}},
            {"name": "p18", "type": {"type": "bytes", "logicalType": "decimal", "precision": 18}},
            {"name": "p19", "type": {"type": "bytes", "logicalType": "decimal", "precision": 19}},
            {"name": "f6", "type": {"type": "fixed", "name": "F3", "size": 3,
                                    "logicalType": "decimal", "precision": 6}},
            {"name": "text", "type": "string"},
        ],
    }  # fmt: skip
    cases = []  # (p4, p18, p19, f6, text), whether it decodes
    for p, field in ((4, 0), (18, 1), (19, 2)):
        for v in (10**p - 1, -(10**p - 1), 10**p, -(10**p), 0, -1, 1):
            for width in range(1, 11):
                if not -(2 ** (8 * width - 1)) <= v < 2 ** (8 * width - 1):
                    continue
                row: list[Any] = [1, 1, 1, 1, "ok"]
                row[field] = v.to_bytes(width, "big", signed=True)
                cases.append((row, abs(v) < 10**p))
    for v in (999_999, -999_999, 1_000_000, -1_000_000, 0, -1):
        cases.append(([1, 1, 1, v, "ok"], abs(v) < 10**6))
    for text, ok in (("plain", True), ("été", True), ("x" * 40 + "ñ", True), (b"a\xff", False),
                     (b"abc\xc3", False), (b"", True)):  # fmt: skip
        cases.append(([1, 1, 1, 1, text], ok))
    values = []
    for row, _ in cases:
        out = b"\x00\x00\x00\x00\x01"
        for v in row[:3]:
            raw = v if isinstance(v, bytes) else v.to_bytes(1, "big", signed=True)
            out += _zigzag(len(raw)) + raw
        out += row[3].to_bytes(3, "big", signed=True)
        text = row[4].encode() if isinstance(row[4], str) else row[4]
        values.append(out + _zigzag(len(text)) + text)
    arr = pa.array(values, pa.binary())
    gen = compile_decoder(json.dumps(schema), kernel="generated")
    got = gen.decode(arr)
    assert gen._generated is not None
    assert_identical(got, compile_decoder(json.dumps(schema), kernel="interpreter").decode(arr))
    assert [e is None for e in got.errors.to_pylist()] == [ok for _, ok in cases]
    for (row, ok), value in zip(cases, got.values.to_pylist(), strict=True):
        if ok:
            want = [int.from_bytes(v, "big", signed=True) if isinstance(v, bytes) else v
                    for v in row[:4]]  # fmt: skip
            assert [int(value[k]) for k in ("p4", "p18", "p19", "f6")] == want


SETTINGS = settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


@SETTINGS
@given(with_evolution(), st.data())
def test_random_evolutions_decode_as_the_interpreter(
    case: tuple[dict[str, Any], dict[str, Any], list[str]], data: st.DataObject
) -> None:
    writer, reader, _ = case
    records = data.draw(st.lists(values_of(writer), min_size=1, max_size=8))
    good = frame(writer, records).to_pylist()
    values = pa.array(good + damage(good[:2]), pa.binary())
    pair = (json.dumps(writer), json.dumps(reader))
    got = compile_decoder(*pair, kernel="generated").decode(values)
    assert_identical(got, compile_decoder(*pair, kernel="interpreter").decode(values))


SIMPLE = json.dumps(
    {"type": "record", "name": "S", "fields": [{"name": "a", "type": ["null", "string"]}]}
)


def test_the_cache_rewrites_a_torn_file_and_refuses_a_shared_directory(
    kernel_cache: Path,
) -> None:
    values = frame(json.loads(SIMPLE), [{"a": "x"}, {"a": None}])
    dec = compile_decoder(SIMPLE, kernel="generated")
    (source,) = kernel_cache.glob("loglake_avro_*.py")
    assert dec.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    assert avro_codegen.is_cached(dec._source)
    # a torn (or tampered) file under the expected name is rewritten before import
    text = source.read_text()
    source.write_text(text[: len(text) // 2])
    avro_codegen._LOADED.clear()
    again = compile_decoder(SIMPLE, kernel="generated")
    assert source.read_text() == text
    assert again.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    # a directory others can write to is not used: the kernel compiles in memory
    os.chmod(kernel_cache, 0o777)
    assert avro_codegen.cache_dir() is None
    avro_codegen._LOADED.clear()
    assert not avro_codegen.is_cached(dec._source)
    third = compile_decoder(SIMPLE, kernel="generated")
    assert third._generated is not None
    assert third.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    os.chmod(kernel_cache, 0o700)


def test_auto_switches_once_the_generated_kernel_pays(
    kernel_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(avro, "AUTO_ROWS", 5)
    monkeypatch.setattr(avro, "_AUTO_SEEN", {})
    monkeypatch.setattr(avro_codegen, "_LOADED", {})  # as in a new process
    values = frame(json.loads(SIMPLE), [{"a": "x"}, {"a": None}])
    dec = compile_decoder(SIMPLE)  # "auto"; not compiled on this machine yet
    assert dec.kernel == "auto"
    dec.decode(values)
    dec.decode(values)
    assert dec._generated is None  # 4 rows so far: the interpreter
    dec.decode(values)
    assert dec._generated is not None  # the 5th row: compiled
    # another decoder of the pair finds it in the cache and takes it at once
    other = compile_decoder(SIMPLE)
    monkeypatch.setattr(avro, "_AUTO_SEEN", {})
    assert other.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    assert other._generated is not None
    assert compile_decoder(SIMPLE, kernel="interpreter")._kernel(10**9) is not other._generated


def test_auto_keeps_the_interpreter_when_the_generated_kernel_does_not_compile(
    kernel_cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(source: str) -> Any:
        raise RuntimeError("numba refused the generated code")

    monkeypatch.setattr(avro, "generated_kernel", broken)
    monkeypatch.setattr(avro, "AUTO_ROWS", 1)
    values = frame(json.loads(SIMPLE), [{"a": "x"}, {"a": None}])
    dec = compile_decoder(SIMPLE)
    assert dec.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    assert dec.kernel == "interpreter" and dec._generated is None
    assert "did not compile (RuntimeError: numba refused" in caplog.text
    with pytest.raises(RuntimeError, match="numba refused"):  # asked for explicitly: raised
        compile_decoder(SIMPLE, kernel="generated")


def test_unknown_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="kernel must be one of"):
        compile_decoder(SIMPLE, kernel="jit")


def test_a_full_disk_under_the_cache_compiles_in_memory_and_leaves_no_file(
    tmpfs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache directory on a real filesystem with no free byte (a 1 MiB tmpfs, filled):
    writing the kernel's source fails with ENOSPC, the kernel compiles in memory and decodes,
    and no temporary file is left behind; with room again, the next process caches it."""
    disk = tmpfs(1)
    monkeypatch.setenv("LOGLAKE_CACHE_DIR", str(disk))
    monkeypatch.setattr(avro_codegen, "_LOADED", {})  # as in a new process
    kernels = avro_codegen.cache_dir()
    assert kernels is not None
    filler = fill(disk)
    values = frame(json.loads(SIMPLE), [{"a": "x"}, {"a": None}])
    dec = compile_decoder(SIMPLE, kernel="generated")
    assert dec._generated is not None
    assert dec.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    assert list(kernels.iterdir()) == []  # neither the source nor a torn temporary file
    assert avro_codegen.is_cached(dec._source)  # loaded in this process only
    filler.unlink()
    monkeypatch.setattr(avro_codegen, "_LOADED", {})
    assert not avro_codegen.is_cached(dec._source)
    again = compile_decoder(SIMPLE, kernel="generated")
    assert again.decode(values).values.to_pylist() == [{"a": "x"}, {"a": None}]
    assert [p.suffix for p in kernels.glob("loglake_avro_*")] == [".py"]
