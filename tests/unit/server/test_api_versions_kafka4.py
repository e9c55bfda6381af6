"""What the broker serves, API by API, against the ApiVersions of a Kafka 4.0 broker.

``KAFKA_4_0`` is the range a Kafka 4.0 broker answers for each API the broker serves, or may
serve soon (``clients/src/main/resources/common/message/*Request.json`` ``validVersions``
at 4.0.0; the minimums are KIP-896's baseline: Kafka 4.0 removed the versions older clients
used, and no client this project tests sends one of them). The versions added in 4.1 are in
``KAFKA_4_1_ADDED``. Wherever loglake's range differs from Kafka 4.0's, ``DIFFERENCES`` says
what it serves and why, so that a change of the registry shows up here and either matches
Kafka or is explained.

Also: every version served has kio request and response types (the broker parses and
answers it with them), and the table is the one ApiVersions advertises (test_registry.py).
"""

from __future__ import annotations

from kio.index import load_request_schema, load_response_schema

from logstore.server.apis import API_HANDLERS

# api key -> (name, min, max) of Kafka 4.0's ApiVersions answer (broker listener).
KAFKA_4_0: dict[int, tuple[str, int, int]] = {
    0: ("Produce", 3, 12),  # advertised from 0 (KAFKA-18659), v0-v2 refused
    1: ("Fetch", 4, 17),
    2: ("ListOffsets", 1, 10),
    3: ("Metadata", 0, 13),
    8: ("OffsetCommit", 2, 9),
    9: ("OffsetFetch", 1, 9),
    10: ("FindCoordinator", 0, 6),
    11: ("JoinGroup", 0, 9),
    12: ("Heartbeat", 0, 4),
    13: ("LeaveGroup", 0, 5),
    14: ("SyncGroup", 0, 5),
    15: ("DescribeGroups", 0, 6),
    16: ("ListGroups", 0, 5),
    17: ("SaslHandshake", 0, 1),
    18: ("ApiVersions", 0, 4),
    19: ("CreateTopics", 2, 7),
    20: ("DeleteTopics", 1, 6),
    21: ("DeleteRecords", 0, 2),
    22: ("InitProducerId", 0, 5),
    24: ("AddPartitionsToTxn", 0, 5),
    25: ("AddOffsetsToTxn", 0, 4),
    26: ("EndTxn", 0, 5),
    28: ("TxnOffsetCommit", 0, 5),
    29: ("DescribeAcls", 1, 3),
    30: ("CreateAcls", 1, 3),
    31: ("DeleteAcls", 1, 3),
    32: ("DescribeConfigs", 1, 4),
    33: ("AlterConfigs", 0, 2),
    35: ("DescribeLogDirs", 1, 4),
    36: ("SaslAuthenticate", 0, 2),
    37: ("CreatePartitions", 0, 3),
    42: ("DeleteGroups", 0, 2),
    44: ("IncrementalAlterConfigs", 0, 1),
    47: ("OffsetDelete", 0, 0),
    50: ("DescribeUserScramCredentials", 0, 0),
    51: ("AlterUserScramCredentials", 0, 0),
    65: ("DescribeTransactions", 0, 0),
    66: ("ListTransactions", 0, 1),
}

# Versions Kafka 4.1 added to the APIs above: api key -> its 4.1 maximum.
KAFKA_4_1_ADDED: dict[int, int] = {
    0: 13,  # Produce v13: topic ids (KIP-516)
    8: 10,  # OffsetCommit v10: topic ids
    9: 10,  # OffsetFetch v10: topic ids
    66: 2,  # ListTransactions v2: transactional id pattern (KIP-1152)
}

# Where loglake serves another range than Kafka 4.0: (min, max, why).
DIFFERENCES: dict[int, tuple[int, int, str]] = {
    0: (
        3,
        11,
        "Produce v12 is transaction protocol v2 (KIP-890 part 2), sent only to a broker that "
        "finalizes the transaction.version feature, which this one does not advertise",
    ),
    24: (
        0,
        3,
        "AddPartitionsToTxn v4+ batch several transactions and are sent by brokers only "
        "(Kafka's own schema: 'versions 3 and below will be exclusively used by clients')",
    ),
    26: (
        0,
        4,
        "EndTxn v5 is transaction protocol v2 (KIP-890 part 2), used only when the broker "
        "finalizes the transaction.version feature, which this one does not",
    ),
    28: (
        0,
        4,
        "TxnOffsetCommit v5 is transaction protocol v2 (KIP-890 part 2), as EndTxn v5",
    ),
}

# Kafka 4.0 APIs not served yet although in KAFKA_4_0 (another change adds them).
NOT_SERVED_YET = {35}


def _served() -> dict[int, tuple[int, int]]:
    return {k: (lo, hi) for k, (lo, hi, _fn) in API_HANDLERS.items()}


def test_every_served_api_is_a_kafka_api_with_kafka_4_0s_range_or_an_explained_one() -> None:
    served = _served()
    unknown = sorted(set(served) - set(KAFKA_4_0))
    assert not unknown, f"api keys served but not in the Kafka 4.0 table: {unknown}"
    wrong = {}
    for key, (lo, hi) in served.items():
        name, k_lo, k_hi = KAFKA_4_0[key]
        want = DIFFERENCES[key][:2] if key in DIFFERENCES else (k_lo, k_hi)
        if (lo, hi) != want:
            wrong[name] = {"served": (lo, hi), "expected": want, "kafka 4.0": (k_lo, k_hi)}
    assert not wrong, wrong
    missing = sorted(set(KAFKA_4_0) - set(served) - NOT_SERVED_YET)
    assert not missing, [KAFKA_4_0[k][0] for k in missing]


def test_the_differences_are_real_and_stay_within_kafka_4s_versions() -> None:
    for key, (lo, hi, why) in DIFFERENCES.items():
        _name, k_lo, k_hi = KAFKA_4_0[key]
        assert (lo, hi) != (k_lo, k_hi) and why
        # never a version Kafka 4.x refuses (KIP-896), never one it does not have
        assert k_lo <= lo <= hi <= max(k_hi, KAFKA_4_1_ADDED.get(key, k_hi))
    for key, hi in KAFKA_4_1_ADDED.items():
        assert hi > KAFKA_4_0[key][2]


def test_kio_has_request_and_response_types_for_every_version_served() -> None:
    for key, (lo, hi) in _served().items():
        for version in range(lo, hi + 1):
            request = load_request_schema(key, version)
            response = load_response_schema(key, version)
            assert (request.__api_key__, request.__version__) == (key, version)
            assert (response.__api_key__, response.__version__) == (key, version)
