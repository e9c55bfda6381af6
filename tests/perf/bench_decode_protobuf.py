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
  ``protobuf.compiled_vs_upb`` is the ratio;
- ``json.decoder``: :class:`~pipelines.typed.jsonschema.JsonDecoder` (payloads joined, one
  ``pyarrow.json`` pass), vs ``json.loads_per_record`` + ``pa.array``.

Run: ``.venv/bin/python tests/perf/bench_decode_protobuf.py [--records N]``; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

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
    import base64

    return cls, base64.b64encode(fdp.SerializeToString()).decode()


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
    schema = RegisteredSchema("PROTOBUF", text)
    decoder = ProtobufDecoder(schema)
    upb = UpbDecoder(schema)
    decoder.decode(framed.slice(0, 10))  # the kernel compiled (or loaded) off the clock
    out: dict[str, Any] = {"records": n}
    sample = framed.slice(0, 1000)
    if decoder.decode(sample).values != upb.decode(sample).values:
        raise SystemExit("the compiled decoder and upb disagree on the benchmark's payloads")
    out["protobuf.compiled"] = _rate(n, lambda: decoder.decode(framed, offsets_skip=5))
    out["protobuf.upb"] = _rate(n, lambda: upb.decode(framed, offsets_skip=5))
    out["protobuf.compiled_vs_upb"] = round(out["protobuf.compiled"] / out["protobuf.upb"], 1)

    def baseline() -> None:
        for item in framed.to_pylist():
            json_format.MessageToDict(cls.FromString(item[6:]))

    out["protobuf.message_to_dict"] = _rate(n, baseline)

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
