"""Every topic-level config of Apache Kafka 4.x, with its type, default, rule and broker synonyms.

The registry is Kafka's ``LogConfig`` definition (``storage/.../internals/log/LogConfig.java``,
4.x) plus loglake's one key of its own (``compaction.strategy``). Each entry says whether
loglake *implements* the key (it changes what the broker or the jobs do) or keeps it as a
*no-op* (it is validated, stored and shown by DescribeConfigs, and has no effect on a single
node: replication, throttles, tiered storage). The README's topic-config table is checked
against :data:`TOPIC_CONFIGS` both ways by ``tests/unit/storage/test_topic_config_defs.py``.

Why a registry and not only :class:`~logstore.storage.config.LogConfig`: tools that create
topics (Kafka Connect, Debezium, schema registries, Terraform) send configs this engine does
not act on; Kafka accepts them, so must we, with Kafka's validation and the same
``INVALID_CONFIG`` for a bad value. An unknown key is refused naming the nearest known one.

Differences from Kafka's rules, on purpose: ``segment.bytes`` >= 14 (Kafka 4.x: 1 MiB; loglake
keeps small segments possible for tests and for its Spark jobs' splitting, as Kafka's
internal ``internal.segment.bytes`` does) and ``segment.index.bytes`` >= 8 (one offset-index
entry; Kafka: 4, which holds none).

Pure data and functions; immutable, hence thread-safe.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from logstore.errors import InvalidConfigError

__all__ = [
    "CONFIG_TYPE_IDS",
    "TOPIC_CONFIGS",
    "TopicConfigDef",
    "nearest_key",
    "parse_topic_value",
    "validate_topic_properties",
]

LONG_MAX: Final = 2**63 - 1
LONG_MIN: Final = -(2**63)
INT_MAX: Final = 2**31 - 1
INT_MIN: Final = -(2**31)

ConfigType = Literal["boolean", "string", "int", "long", "double", "list"]
Status = Literal["implemented", "no-op"]

# Kafka's DescribeConfigs ConfigType ids (KIP-569)
CONFIG_TYPE_IDS: Final[dict[str, int]] = {
    "boolean": 1,
    "string": 2,
    "int": 3,
    "long": 5,
    "double": 6,
    "list": 7,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicConfigDef:
    """One topic config: Kafka's definition and what loglake does with it.

    ``synonyms`` are the broker keys whose value is the topic's default, most specific
    first (Kafka's ``ServerTopicConfigSynonyms``: ``log.roll.ms`` before ``log.roll.hours``).
    ``low``/``high`` bound numbers (inclusive), ``choices`` bound strings and list items;
    ``rule`` names a special validator (``gzip-level``, ``throttled-replicas``,
    ``compaction-strategy``).
    """

    name: str
    type: ConfigType
    default: str
    status: Status
    doc: str
    synonyms: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    rule: str | None = None

    @property
    def type_id(self) -> int:
        return CONFIG_TYPE_IDS[self.type]


def _c(
    name: str,
    type_: ConfigType,
    default: str,
    status: Status,
    doc: str,
    *synonyms: str,
    low: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] | None = None,
    rule: str | None = None,
) -> TopicConfigDef:
    return TopicConfigDef(
        name=name,
        type=type_,
        default=default,
        status=status,
        doc=doc,
        synonyms=synonyms,
        low=low,
        high=high,
        choices=choices,
        rule=rule,
    )


_I: Final[Status] = "implemented"
_N: Final[Status] = "no-op"
_COMPRESSION = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")

TOPIC_CONFIGS: Final[dict[str, TopicConfigDef]] = {
    d.name: d
    for d in (
        _c(
            "segment.bytes",
            "int",
            "1073741824",
            _I,
            "segment size before a roll",
            "log.segment.bytes",
            low=14,
        ),
        _c(
            "segment.ms",
            "long",
            "604800000",
            _I,
            "segment age before a roll",
            "log.roll.ms",
            "log.roll.hours",
            low=1,
        ),
        _c(
            "segment.jitter.ms",
            "long",
            "0",
            _I,
            "random amount (per segment, below min(this, segment.ms)) taken off segment.ms",
            "log.roll.jitter.ms",
            "log.roll.jitter.hours",
            low=0,
        ),
        _c(
            "segment.index.bytes",
            "int",
            "10485760",
            _I,
            "offset/time index file size",
            "log.index.size.max.bytes",
            low=8,
        ),
        _c(
            "index.interval.bytes",
            "int",
            "4096",
            _I,
            "bytes between offset-index entries",
            "log.index.interval.bytes",
            low=0,
        ),
        _c(
            "flush.messages",
            "long",
            str(LONG_MAX),
            _I,
            "fsync after this many records",
            "log.flush.interval.messages",
            low=1,
        ),
        _c(
            "flush.ms",
            "long",
            str(LONG_MAX),
            _I,
            "fsync a log unflushed this long",
            "log.flush.interval.ms",
            "log.flush.scheduler.interval.ms",
            low=0,
        ),
        _c(
            "retention.ms",
            "long",
            "604800000",
            _I,
            "delete segments older than (-1: never)",
            "log.retention.ms",
            "log.retention.minutes",
            "log.retention.hours",
            low=-1,
        ),
        _c(
            "retention.bytes",
            "long",
            "-1",
            _I,
            "delete oldest segments above (-1: never)",
            "log.retention.bytes",
        ),
        _c(
            "file.delete.delay.ms",
            "long",
            "60000",
            _I,
            "delay before removing .deleted files",
            "log.segment.delete.delay.ms",
            low=0,
        ),
        _c(
            "cleanup.policy",
            "list",
            "delete",
            _I,
            "delete and/or compact",
            "log.cleanup.policy",
            choices=("compact", "delete"),
        ),
        _c(
            "min.compaction.lag.ms",
            "long",
            "0",
            _I,
            "records younger than this stay uncleaned",
            "log.cleaner.min.compaction.lag.ms",
            low=0,
        ),
        _c(
            "max.compaction.lag.ms",
            "long",
            str(LONG_MAX),
            _I,
            "a log whose oldest dirty record is older than this is due for cleaning",
            "log.cleaner.max.compaction.lag.ms",
            low=1,
        ),
        _c(
            "min.cleanable.dirty.ratio",
            "double",
            "0.5",
            _I,
            "a log is due for cleaning when dirty bytes / cleanable bytes reach this",
            "log.cleaner.min.cleanable.ratio",
            low=0.0,
            high=1.0,
        ),
        _c(
            "delete.retention.ms",
            "long",
            "86400000",
            _I,
            "how long tombstones survive cleaning",
            "log.cleaner.delete.retention.ms",
            low=0,
        ),
        _c(
            "max.message.bytes",
            "int",
            "1048588",
            _I,
            "largest record batch accepted",
            "message.max.bytes",
            low=0,
        ),
        _c(
            "message.timestamp.type",
            "string",
            "CreateTime",
            _I,
            "CreateTime or LogAppendTime (the broker stamps the batches)",
            "log.message.timestamp.type",
            choices=("CreateTime", "LogAppendTime"),
        ),
        _c(
            "message.timestamp.before.max.ms",
            "long",
            str(LONG_MAX),
            _I,
            "CreateTime: refuse (INVALID_TIMESTAMP) a batch timestamped more than this before now",
            "log.message.timestamp.before.max.ms",
            low=0,
        ),
        _c(
            "message.timestamp.after.max.ms",
            "long",
            "3600000",
            _I,
            "CreateTime: refuse (INVALID_TIMESTAMP) a batch timestamped more than this after now",
            "log.message.timestamp.after.max.ms",
            low=0,
        ),
        _c(
            "compression.type",
            "string",
            "producer",
            _I,
            "producer keeps batches as sent; any other codec: batches of another codec are"
            " recompressed on append",
            "compression.type",
            choices=_COMPRESSION,
        ),
        _c(
            "compression.gzip.level",
            "int",
            "-1",
            _I,
            "gzip level of recompressed batches (-1: zlib's default, 6)",
            "compression.gzip.level",
            rule="gzip-level",
        ),
        _c(
            "compression.lz4.level",
            "int",
            "9",
            _I,
            "lz4 level of recompressed batches",
            "compression.lz4.level",
            low=1,
            high=17,
        ),
        _c(
            "compression.zstd.level",
            "int",
            "3",
            _I,
            "zstd level of recompressed batches",
            "compression.zstd.level",
            low=-131072,
            high=22,
        ),
        _c(
            "preallocate",
            "boolean",
            "false",
            _I,
            "reserve segment.bytes of disk blocks for a new segment",
            "log.preallocate",
        ),
        _c(
            "compaction.strategy",
            "string",
            "offset",
            _I,
            "loglake (KIP-280's name): which record of a key wins: offset, timestamp or"
            " header:<name>",
            rule="compaction-strategy",
        ),
        # no-ops on a single node
        _c(
            "min.insync.replicas",
            "int",
            "1",
            _N,
            "one replica: always in sync",
            "min.insync.replicas",
            low=1,
        ),
        _c(
            "unclean.leader.election.enable",
            "boolean",
            "false",
            _N,
            "one replica: no election",
            "unclean.leader.election.enable",
        ),
        _c(
            "leader.replication.throttled.replicas",
            "list",
            "",
            _N,
            "no replication to throttle",
            rule="throttled-replicas",
        ),
        _c(
            "follower.replication.throttled.replicas",
            "list",
            "",
            _N,
            "no replication to throttle",
            rule="throttled-replicas",
        ),
        _c(
            "remote.storage.enable",
            "boolean",
            "false",
            _I,
            "tier closed segments to object storage (KIP-405; needs the broker's"
            " remote.log.storage.system.enable; not for compacted topics)",
        ),
        _c(
            "local.retention.ms",
            "long",
            "-2",
            _I,
            "tiered topics: how long tiered segments stay on local disk (-2: retention.ms)",
            "log.local.retention.ms",
            low=-2,
        ),
        _c(
            "local.retention.bytes",
            "long",
            "-2",
            _I,
            "tiered topics: local bytes kept of tiered segments (-2: retention.bytes)",
            "log.local.retention.bytes",
            low=-2,
        ),
        _c("remote.log.copy.disable", "boolean", "false", _N, "tiered storage copy switch"),
        _c(
            "remote.log.delete.on.disable",
            "boolean",
            "false",
            _N,
            "tiered storage: delete remote data when disabled",
        ),
        _c("remote.copy.lag.ms", "long", "0", _N, "tiered storage copy lag", low=-1),
        _c("remote.copy.lag.bytes", "long", "0", _N, "tiered storage copy lag", low=-1),
    )
}


def nearest_key(key: str, known: Mapping[str, object] | tuple[str, ...]) -> str | None:
    """The known key closest to ``key`` (difflib), or None when nothing is close."""
    found = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return found[0] if found else None


def _unknown(key: str) -> InvalidConfigError:
    near = nearest_key(key, TOPIC_CONFIGS)
    hint = f"; did you mean {near!r}?" if near else ""
    return InvalidConfigError(f"unknown topic config {key!r}{hint}")


def parse_topic_value(key: str, raw: object) -> object:
    """``raw`` (a string as Kafka's configs are sent) parsed and checked against ``key``'s rule.

    Returns ``bool``/``int``/``float``/``str`` (lists as their comma-joined, trimmed form).
    Raises :class:`InvalidConfigError` naming the key, the value and the rule; an unknown key
    is refused naming the nearest known key.
    """
    d = TOPIC_CONFIGS.get(key)
    if d is None:
        raise _unknown(key)
    text = str(raw).strip()
    bad = f"{key}={raw!r}:"
    if d.type == "boolean":
        if text.lower() not in ("true", "false"):
            raise InvalidConfigError(f"{bad} expected true or false")
        return text.lower() == "true"
    if d.type in ("int", "long"):
        try:
            value: int | float = int(text)
        except ValueError:
            raise InvalidConfigError(f"{bad} expected an integer ({d.type})") from None
        lo, hi = (INT_MIN, INT_MAX) if d.type == "int" else (LONG_MIN, LONG_MAX)
        if not lo <= value <= hi:
            raise InvalidConfigError(f"{bad} out of range for a {d.type}")
        if d.rule == "gzip-level" and value != -1 and not 1 <= value <= 9:
            raise InvalidConfigError(f"{bad} expected -1 or a value in [1, 9]")
    elif d.type == "double":
        try:
            value = float(text)
        except ValueError:
            raise InvalidConfigError(f"{bad} expected a number (double)") from None
        if math.isnan(value):
            raise InvalidConfigError(f"{bad} expected a number (double)")
    else:
        return _parse_text(d, text, bad)
    if d.low is not None and value < d.low:
        rule = f"in [{_num(d.low)}, {_num(d.high)}]" if d.high is not None else f">= {_num(d.low)}"
        raise InvalidConfigError(f"{bad} expected a value {rule}")
    if d.high is not None and value > d.high:
        raise InvalidConfigError(f"{bad} expected a value in [{_num(d.low)}, {_num(d.high)}]")
    return value


def _num(v: float | None) -> str:
    return "" if v is None else (str(int(v)) if float(v).is_integer() else str(v))


def _parse_text(d: TopicConfigDef, text: str, bad: str) -> str:
    if d.type == "list":
        items = [p.strip() for p in text.split(",") if p.strip()]
        if d.choices is not None:
            if not items:
                raise InvalidConfigError(f"{bad} expected a list of {', '.join(d.choices)}")
            for item in items:
                if item not in d.choices:
                    raise InvalidConfigError(f"{bad} {item!r} is not one of {', '.join(d.choices)}")
        if d.rule == "throttled-replicas" and items != ["*"]:
            for item in items:
                part, sep, broker = item.partition(":")
                if not (sep and part.strip().isdigit() and broker.strip().isdigit()):
                    raise InvalidConfigError(
                        f"{bad} expected * or a list of partitionId:brokerId entries"
                    )
        return ",".join(items)
    if d.choices is not None and text not in d.choices:
        raise InvalidConfigError(f"{bad} expected one of {', '.join(d.choices)}")
    if d.rule == "compaction-strategy" and not (
        text in ("offset", "timestamp") or (text.startswith("header:") and len(text) > 7)
    ):
        raise InvalidConfigError(f"{bad} expected offset, timestamp or header:<name>")
    return text


def validate_topic_properties(props: Mapping[str, str]) -> dict[str, object]:
    """Every ``key=value`` of ``props`` parsed (:func:`parse_topic_value`); the first bad one
    raises :class:`InvalidConfigError`. Kafka's cross-key rules of tiered storage
    (``LogConfig.validateRemoteStorage*``) hold among the keys given: no
    ``remote.storage.enable=true`` on a compacted topic, and ``local.retention.*`` (when not
    ``-2``) within ``retention.*`` (when not ``-1``)."""
    parsed = {key: parse_topic_value(key, value) for key, value in props.items()}
    if parsed.get("remote.storage.enable") is True:
        policy = str(parsed.get("cleanup.policy", ""))
        if "compact" in {p.strip() for p in policy.split(",")}:
            raise InvalidConfigError(
                f"remote.storage.enable=true: remote log storage is not supported for "
                f"compacted topics (cleanup.policy={policy})"
            )
    for unit in ("ms", "bytes"):
        local, total = parsed.get(f"local.retention.{unit}"), parsed.get(f"retention.{unit}")
        if (
            isinstance(local, int)
            and isinstance(total, int)
            and local != -2
            and total != -1
            and (local == -1 or local > total)
        ):
            raise InvalidConfigError(
                f"local.retention.{unit}={local}: must be -2 or at most retention.{unit}={total}"
            )
    return parsed
