"""Produce over SASL_SSL vs PLAINTEXT and fetch over SSL vs PLAINTEXT, one broker, same run.

One broker subprocess with three listeners (PLAINTEXT, SSL, SASL_SSL with SCRAM-SHA-512; a
user made with AlterUserScramCredentials), certificates made by tests/fixtures/tls.py.
Rounds alternate the variants so that the load of a shared machine falls on each alike;
every run is printed, then one JSON object with the medians and the ratios:

- produce: ``--records`` records of 100 B with librdkafka (lz4, acks=all, idempotence,
  linger.ms=5) timed from the first ``produce()`` to the end of ``flush()``;
  ratio SASL_SSL / PLAINTEXT (issue 23's target: >= 0.6);
- fetch: librdkafka consumes a topic of ``--records`` / 4 records of 1 KiB (written once over
  PLAINTEXT; ``fetch.max.bytes`` 50 MB) from offset 0 to its end, in records/s (x 1 KiB for
  bytes); ratio SSL / PLAINTEXT (target >= 0.5). 1 KiB rather than 100 B so that bytes, not
  the client's per-message cost, dominate. Over TLS the records are read
  with ``pread`` in 256 KiB chunks and encrypted (no sendfile, no kernel TLS in 3.11).

    .venv/bin/python tests/perf/bench_security.py [--records 300000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from tests.fixtures.broker import BrokerProcess  # noqa: E402
from tests.fixtures.tls import make_pki  # noqa: E402


def _conf(b: BrokerProcess, pki, variant: str) -> dict[str, object]:
    if variant == "PLAINTEXT":
        return {"bootstrap.servers": b.bootstrap}
    conf: dict[str, object] = {
        "bootstrap.servers": f"127.0.0.1:{b.ports[variant]}",
        "security.protocol": variant,
        "ssl.ca.location": str(pki.ca),
    }
    if variant == "SASL_SSL":
        conf |= {"sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "bench"}
        conf["sasl.password"] = "bench-pw"
    return conf


def _topic(b: BrokerProcess, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def produce(conf: dict[str, object], topic: str, n: int, size: int = 100) -> float:
    p = ck.Producer(
        {**conf, "acks": "all", "enable.idempotence": True, "compression.type": "lz4"}
        | {"linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 2_000_000}
    )
    half = size // 2
    rnd = os.urandom(half * 1024)
    values = [rnd[i * half : i * half + half] + b"x" * (size - half) for i in range(1024)]
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, values[i & 1023], partition=0)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0
    return n / (time.perf_counter() - start)


def fetch(conf: dict[str, object], topic: str, n: int) -> float:
    c = ck.Consumer(
        {**conf, "group.id": f"bench-{time.monotonic_ns()}", "enable.auto.commit": False}
        | {"fetch.max.bytes": 50_000_000, "max.partition.fetch.bytes": 10_000_000}
    )
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got = 0
    start = time.perf_counter()
    while got < n:
        got += sum(1 for m in c.consume(10_000, 5.0) if m.error() is None)
    rate = n / (time.perf_counter() - start)
    c.close()
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-sec-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        b = BrokerProcess(
            Path(tmp) / "broker",
            extra_listeners=("SSL", "SASL_SSL"),
            **{
                "ssl.keystore.type": "PEM",
                "ssl.keystore.location": str(pki.server),
                "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            },
        )
        b.start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            cred = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
            upsert = UserScramCredentialUpsertion("bench", cred, b"bench-pw")
            admin.alter_user_scram_credentials([upsert])["bench"].result(30)
            runs: dict[str, list[float]] = {}
            fetch_n = args.records // 4
            fetch_topic = _topic(b, "fetch-1k")
            produce(_conf(b, pki, "PLAINTEXT"), fetch_topic, fetch_n, 1024)
            for r in range(args.rounds):
                for variant in (
                    ("PLAINTEXT", "SASL_SSL") if r % 2 == 0 else ("SASL_SSL", "PLAINTEXT")
                ):
                    topic = _topic(b, f"p-{variant.lower()}-{r}")
                    rate = produce(_conf(b, pki, variant), topic, args.records)
                    runs.setdefault(f"produce {variant}", []).append(rate)
                    print(f"round {r} produce {variant:9s} {rate:12,.0f} records/s", flush=True)
                for variant in ("PLAINTEXT", "SSL") if r % 2 == 0 else ("SSL", "PLAINTEXT"):
                    rate = fetch(_conf(b, pki, variant), fetch_topic, fetch_n)
                    runs.setdefault(f"fetch {variant}", []).append(rate)
                    print(f"round {r} fetch   {variant:9s} {rate:12,.0f} records/s", flush=True)
        finally:
            b.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratios = {
        "produce SASL_SSL/PLAINTEXT": med["produce SASL_SSL"] / med["produce PLAINTEXT"],
        "fetch SSL/PLAINTEXT": med["fetch SSL"] / med["fetch PLAINTEXT"],
    }
    print(json.dumps({"runs": runs, "median": med, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
