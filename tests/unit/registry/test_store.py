"""The store over a list standing in for ``_schemas`` (the broker-backed log is covered by
tests/integration/broker/test_schema_registry.py): replaying the records rebuilds the same
state, ids stay unique, compatibility levels and modes behave as Confluent's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from logstore.registry.errors import IncompatibleSchemaError, RegistryError
from logstore.registry.formats import parse
from logstore.registry.store import SchemaStore

Records = list[tuple[bytes, bytes | None]]


def _store(log: Records) -> SchemaStore:
    s = SchemaStore(append=log.extend)
    s.load(list(log))
    return s


def _avro(*fields: tuple[str, Any], default: bool = False) -> dict[str, str]:
    fs = []
    for name, t in fields:
        f: dict[str, Any] = {"name": name, "type": t}
        if default:
            f["default"] = None if isinstance(t, list) else 0
        fs.append(f)
    return {"schema": json.dumps({"type": "record", "name": "R", "fields": fs})}


def _state(s: SchemaStore) -> Any:
    return {
        subj: [(v, s.version(subj, v, deleted=True).id) for v in s.versions(subj, deleted=True)]
        for subj in s.subjects(deleted=True)
    }


def test_replay_rebuilds_state_and_ids_are_not_reused() -> None:
    log: Records = []
    s = _store(log)
    a = s.register("a", _avro(("x", "int")))
    b = s.register("a", _avro(("x", "int"), ("y", ["null", "int"]), default=True))
    assert s.register("a", _avro(("x", "int"))) == a  # idempotent
    assert s.register("b", _avro(("x", "int"))) == a  # global ids
    c = s.register("c", {"schema": '"string"'})
    s.set_config("a", "full")
    s.set_mode("b", "READONLY")
    assert s.delete_subject("c", permanent=False) == [1]
    assert s.delete_subject("c", permanent=True) == [1]
    assert len({a, b, c}) == 3

    keys = [json.loads(k) for k, _ in log]
    assert {k["keytype"] for k in keys} == {"SCHEMA", "CONFIG", "MODE", "DELETE_SUBJECT"}
    replayed = _store(log)
    assert _state(replayed) == _state(s) == {"a": [(1, a), (2, b)], "b": [(1, a)]}
    assert replayed.config("a") == "FULL" and replayed.mode("b") == "READONLY"
    # c's id was the highest and is gone: a new schema still gets a fresh one
    assert replayed.register("d", {"schema": '"bytes"'}) == c + 1


def test_transitive_levels_compare_every_version() -> None:
    s = _store([])
    s.register("t", _avro(("x", "int")))
    s.set_config("t", "NONE")
    s.register("t", _avro(("x", "int"), ("y", "string")))
    third = _avro(("y", "string"))  # reads v2's data, not v1's (no y there, no default)
    versions = [s.version("t", v) for v in s.versions("t")]
    assert s.check("t", parse("AVRO", third["schema"]), against=versions, level="BACKWARD") == []
    s.set_config("t", "BACKWARD_TRANSITIVE")
    with pytest.raises(IncompatibleSchemaError) as exc:
        s.register("t", third)
    assert exc.value.status == 409 and "v1 (backward)" in str(exc.value)
    s.set_config("t", "BACKWARD")
    assert s.register("t", third) > 0


def test_modes_and_levels_are_validated() -> None:
    s = _store([])
    with pytest.raises(RegistryError) as exc:
        s.set_config(None, "SIDEWAYS")
    assert exc.value.error_code == 42203
    with pytest.raises(RegistryError) as exc:
        s.set_mode(None, "WRITEONLY")
    assert exc.value.error_code == 42204
    s.set_mode(None, "IMPORT")
    assert s.register("imp", {**_avro(("x", "int")), "id": 100, "version": 3}) == 100
    assert s.versions("imp") == [3]
    s.set_mode(None, "READONLY")
    with pytest.raises(RegistryError) as exc:
        s.register("imp", _avro(("x", "long")))
    assert exc.value.error_code == 42205
