"""Produce throughput with the authorizer holding 10,000 ACLs vs no authorizer, same run.

Two broker subprocesses on the same machine, started the same way: one plain, one with
``authorizer.class.name`` (StandardAuthorizer) and ``--acls`` ACLs (default 10,000) made with
confluent-kafka's ``create_acls``: for other principals, half literal topic names, a quarter
prefixed topic patterns (``team-<i>-``), the rest on groups and transactional ids; plus the
producer's own (User:ANONYMOUS on the PLAINTEXT listener, not a super user): WRITE on the
prefixed pattern ``bench-`` and IDEMPOTENT_WRITE on the cluster, so every produce request
goes through a real decision (cached after the first). The first batch of ACLs is made under
``allow.everyone.if.no.acl.found`` (the cluster has no ACL yet) and gives the producer ALTER
and CREATE on the cluster too, so that it can make the rest and its topics: no super user
short-cuts a decision. Rounds alternate which broker goes
first, so a shared machine's load falls on both alike; every run is printed, then one JSON
object with the medians and the ratio authorizer / none (issue 23's target: >= 0.95), and
the cost of one decision of an in-process authorizer holding the same ACLs (uncached and
cached), a figure the machine's load disturbs less than throughput.

The producer is bench_security's (librdkafka, 100 B records, lz4, acks=all, idempotence,
linger.ms=5), timed from the first ``produce()`` to the end of ``flush()``.

    .venv/bin/python tests/perf/bench_acls.py [--records 300000] [--rounds 3] [--acls 10000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from logstore.server.security import acls as store  # noqa: E402
from logstore.server.security.authorizer import Authorizer  # noqa: E402
from tests.fixtures.broker import BrokerProcess  # noqa: E402
from tests.perf.bench_security import produce  # noqa: E402

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
ALLOW = AclPermissionType.ALLOW


def _bindings(n: int) -> list[AclBinding]:
    out = [
        AclBinding(
            ResourceType.TOPIC,
            "bench-",
            ResourcePatternType.PREFIXED,
            "User:ANONYMOUS",
            "*",
            AclOperation.WRITE,
            ALLOW,
        ),
        *(
            AclBinding(
                ResourceType.BROKER,
                "kafka-cluster",
                ResourcePatternType.LITERAL,
                "User:ANONYMOUS",
                "*",
                op,
                ALLOW,
            )
            for op in (AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.CREATE)
        ),
    ]
    ops = (AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE)
    for i in range(n - len(out)):
        principal = f"User:user-{i % 500}"
        op = ops[i % 3]
        perm = AclPermissionType.DENY if i % 17 == 0 else ALLOW
        kind = i % 4
        if kind in (0, 1):
            args = (ResourceType.TOPIC, f"topic-{i}", ResourcePatternType.LITERAL)
        elif kind == 2:
            args = (ResourceType.TOPIC, f"team-{i}-", ResourcePatternType.PREFIXED)
        elif i % 8 == 3:
            args = (ResourceType.GROUP, f"group-{i}", ResourcePatternType.LITERAL)
        else:
            args = (ResourceType.TRANSACTIONAL_ID, f"txn-{i}", ResourcePatternType.LITERAL)
        out.append(AclBinding(*args, principal, "*", op, perm))
    return out


def _load_acls(b: BrokerProcess, n: int) -> int:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    bindings = _bindings(n)
    for i in range(0, len(bindings), 1000):
        for f in admin.create_acls(bindings[i : i + 1000], request_timeout=60).values():
            f.result(120)
    every = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return len(admin.describe_acls(every).result(60))


def _decision_cost(n: int, tmp: Path) -> dict[str, float]:
    """Microseconds per decision of an in-process authorizer holding the same ACLs: uncached
    (the index walk: literal, ``*``, prefixes) and cached (what a produce pays once warm)."""
    st = store.AclStore(tmp / "decisions.json")
    st.create(
        [
            store.AclBinding(
                b.restype.value,
                b.name,
                b.resource_pattern_type.value,
                b.principal,
                b.host,
                b.operation.value,
                b.permission_type.value,
            )
            for b in _bindings(n)
        ]
    )
    auth = Authorizer(st, super_users=frozenset(), allow_if_no_acl=False)
    write, topic = store.AclOperation.WRITE, store.ResourceType.TOPIC
    calls = 100_000
    start = time.perf_counter()
    for i in range(calls):
        auth._decide("User:ANONYMOUS", "127.0.0.1", write, topic, f"bench-{i % 1000}")
    uncached = (time.perf_counter() - start) / calls * 1e6
    start = time.perf_counter()
    for _ in range(calls):
        auth.authorize("User:ANONYMOUS", "127.0.0.1", write, topic, "bench-1")
    cached = (time.perf_counter() - start) / calls * 1e6
    return {"uncached us": uncached, "cached us": cached}


def _topic(b: BrokerProcess, name: str) -> str:
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    return name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--acls", type=int, default=10_000)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-acls-") as tmp:
        brokers = {
            "none": BrokerProcess(Path(tmp) / "none"),
            "acls": BrokerProcess(
                Path(tmp) / "acls",
                authorizer_class_name=STANDARD,
                allow_everyone_if_no_acl_found="true",
            ),
        }
        try:
            for b in brokers.values():
                b.start()
            start = time.perf_counter()
            count = _load_acls(brokers["acls"], args.acls)
            print(f"{count} ACLs made in {time.perf_counter() - start:.1f} s", flush=True)
            cost = _decision_cost(args.acls, Path(tmp))
            print(
                f"one decision: {cost['uncached us']:.2f} us uncached,"
                f" {cost['cached us']:.2f} us cached",
                flush=True,
            )
            for r in range(args.rounds):
                order = ("none", "acls") if r % 2 == 0 else ("acls", "none")
                for variant in order:
                    b = brokers[variant]
                    topic = _topic(b, f"bench-{variant}-{r}")
                    rate = produce({"bootstrap.servers": b.bootstrap}, topic, args.records)
                    runs.setdefault(variant, []).append(rate)
                    print(f"round {r} produce {variant:5s} {rate:12,.0f} records/s", flush=True)
        finally:
            for b in brokers.values():
                b.stop()
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "acls": count,
        "decision": cost,
        "runs": runs,
        "median": med,
        "ratio authorizer/none": med["acls"] / med["none"],
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
