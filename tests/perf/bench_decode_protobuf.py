"""Benchmark: the typed tables' decoders on one core, records/s, with in-run baselines.

Not the issue's 10M-record ``bench_decode.py`` (that one needs the ``avro`` helper's compiled
decoder and runs ``jobs/decode.py`` on local[2]); this one measures the choices of
``pipelines/typed/protobuf.py`` and ``jsonschema.py`` in one process, no Spark, no I/O:

- ``protobuf.compiled``: :class:`~pipelines.typed.protobuf.ProtobufDecoder` (the compiled
  numba kernel, what ``jobs/decode.py`` uses) over Confluent-framed messages, vs
  ``protobuf.upb``: :class:`~pipelines.typed.protobuf.UpbDecoder` (upb parse per record + the
  typed walk + ``pa.array``: the reference and fallback), vs the baseline
  ``protobuf.message_to_dict``: upb parse + ``json_format.MessageToDict`` per record (what a
  do-it-yourself decoder calls), without building Arrow at all; the same payloads, one core
  (the kernel is compiled, or loaded from numba's cache, before the clock starts);
  ``protobuf.compiled_vs_upb`` is the ratio; ``protobuf.nested.*`` the same two on a nested
  message (an enum, repeated sub-messages, a map, a oneof, a Timestamp);
- ``json.decoder``: :class:`~pipelines.typed.jsonschema.JsonDecoder` (payloads joined, one
  ``pyarrow.json`` pass), vs ``json.loads_per_record`` + ``pa.array``.

Run: ``.venv/bin/python tests/perf/bench_decode_protobuf.py [--records N]``; prints JSON.
"""

from __future__ import annotations

import argparse
import base64
import json
import time
from typing import Any

import pyarrow as pa
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    timestamp_pb2,
)

from pipelines.typed.jsonschema import JsonDecoder
from pipelines.typed.protobuf import ProtobufDecoder, UpbDecoder
from pipelines.typed.registry import RegisteredSchema

F = descriptor_pb2.FieldDescriptorProto


def _proto() -> tuple[Any, str]:
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/e.proto", package="b", syntax="proto3")
    msg = fdp.message_type.add(name="Event")
    for i, (name, t) in enumerate(
        [("id", F.TYPE_INT64), ("user", F.TYPE_STRING), ("amount", F.TYPE_DOUBLE),
         ("count", F.TYPE_INT32), ("ok", F.TYPE_BOOL), ("city", F.TYPE_STRING)], start=1
    ):  # fmt: skip
        msg.field.add(name=name, number=i, type=t, label=F.LABEL_OPTIONAL)
    msg.field.add(name="tags", number=7, type=F.TYPE_STRING, label=F.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("b.Event"))
    return cls, base64.b64encode(fdp.SerializeToString()).decode()


def _order() -> tuple[Any, str]:
    """A nested message: an enum, repeated sub-messages, a map, a oneof and a Timestamp."""
    fdp = descriptor_pb2.FileDescriptorProto(name="bench/o.proto", package="b", syntax="proto3")
    fdp.dependency.append("google/protobuf/timestamp.proto")
    fdp.enum_type.add(name="Status").value.add(name="NEW", number=0)
    fdp.enum_type[0].value.add(name="PAID", number=1)
    msg = fdp.message_type.add(name="Order")
    line = msg.nested_type.add(name="Line")
    line.field.add(name="sku", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    line.field.add(name="qty", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    entry = msg.nested_type.add(name="AttrsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    msg.oneof_decl.add(name="payment")
    add, opt, rep, m = msg.field.add, F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.TYPE_MESSAGE
    add(name="id", number=1, type=F.TYPE_INT64, label=opt)
    add(name="status", number=2, type=F.TYPE_ENUM, type_name=".b.Status", label=opt)
    add(name="lines", number=3, type=m, type_name=".b.Order.Line", label=rep)
    add(name="attrs", number=4, type=m, type_name=".b.Order.AttrsEntry", label=rep)
    add(name="card", number=5, type=F.TYPE_STRING, label=opt, oneof_index=0)
    add(name="cash", number=6, type=F.TYPE_INT64, label=opt, oneof_index=0)
    add(name="at", number=7, type=m, type_name=".google.protobuf.Timestamp", label=opt)
    pool = descriptor_pool.DescriptorPool()
    dep = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(dep)
    pool.Add(dep)
    pool.Add(fdp)
    cls = message_factory.GetMessageClass(pool.FindMessageTypeByName("b.Order"))
    return cls, base64.b64encode(fdp.SerializeToString()).decode()


def _orders(cls: Any, n: int) -> list[bytes]:
    out = []
    for i in range(n):
        o = cls(id=i, status=i % 2)
        for j in range(i % 3):
            o.lines.add(sku=f"s{j}", qty=j + i)
        if i % 2:
            o.attrs["n"] = i
        if i % 3 == 1:
            o.card = f"card{i % 100}"
        elif i % 3 == 2:
            o.cash = i * 100
        o.at.FromMicroseconds(1_700_000_000_000_000 + i)
        out.append(o.SerializeToString())
    return out


def _compare(
    name: str, schema: RegisteredSchema, framed: pa.BinaryArray, out: dict[str, Any]
) -> None:
    """``<name>.compiled`` and ``<name>.upb`` records/s on the same payloads, and the ratio."""
    n = len(framed)
    decoder = ProtobufDecoder(schema)
    upb = UpbDecoder(schema)
    sample = framed.slice(0, 1000)  # the kernel compiled (or loaded) off the clock, and checked
    if decoder.decode(sample).values != upb.decode(sample).values:
        raise SystemExit(f"{name}: the compiled decoder and upb disagree on the payloads")
    out[f"{name}.compiled"] = _rate(n, lambda: decoder.decode(framed, offsets_skip=5))
    out[f"{name}.upb"] = _rate(n, lambda: upb.decode(framed, offsets_skip=5))
    out[f"{name}.compiled_vs_upb"] = round(out[f"{name}.compiled"] / out[f"{name}.upb"], 1)


def _rate(n: int, fn: Any) -> float:
    """Records per second of this process's CPU time: every decoder here runs on one thread,
    and CPU time stays meaningful on a machine shared with other work (wall time does not)."""
    start = time.process_time()
    fn()
    return n / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=200_000)
    n = parser.parse_args().records
    cls, text = _proto()
    header = b"\x00\x00\x00\x00\x01\x00"
    msgs = [
        cls(id=i, user=f"u{i % 1000}", amount=i / 3, count=i % 7, ok=bool(i % 2),
            city="Oslo", tags=["a", "b"][: i % 3]).SerializeToString()
        for i in range(n)
    ]  # fmt: skip
    framed = pa.array([header + m for m in msgs], pa.binary())
    out: dict[str, Any] = {"records": n}
    _compare("protobuf", RegisteredSchema("PROTOBUF", text), framed, out)

    def baseline() -> None:
        for item in framed.to_pylist():
            json_format.MessageToDict(cls.FromString(item[6:]))

    out["protobuf.message_to_dict"] = _rate(n, baseline)
    ocls, otext = _order()
    orders = pa.array([header + m for m in _orders(ocls, n)], pa.binary())
    _compare("protobuf.nested", RegisteredSchema("PROTOBUF", otext), orders, out)

    schema = json.dumps({"type": "object", "properties": {
        "id": {"type": "integer"}, "user": {"type": "string"}, "amount": {"type": "number"},
        "count": {"type": "integer"}, "ok": {"type": "boolean"}, "city": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}}}})  # fmt: skip
    docs = [
        json.dumps({"id": i, "user": f"u{i % 1000}", "amount": i / 3, "count": i % 7,
                    "ok": bool(i % 2), "city": "Oslo", "tags": ["a", "b"][: i % 3]}).encode()
        for i in range(n)
    ]  # fmt: skip
    jframed = pa.array([header[:5] + d for d in docs], pa.binary())
    jdecoder = JsonDecoder(schema)
    out["json.decoder"] = _rate(n, lambda: jdecoder.decode(jframed))

    def json_baseline() -> None:
        pa.array([json.loads(x[5:]) for x in jframed.to_pylist()], type=jdecoder.arrow_type)

    out["json.loads_per_record"] = _rate(n, json_baseline)
    print(json.dumps({k: round(v) if isinstance(v, float) else v for k, v in out.items()}))


if __name__ == "__main__":
    main()
