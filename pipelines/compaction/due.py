"""Which compacted partitions are due for cleaning, and with which settings: Kafka's rules.

Kafka's cleaner (``LogCleanerManager.grabFilthiestCompactedLog`` / ``cleanableOffsets``)
cleans a log when its dirty ratio (dirty bytes over the bytes below the first uncleanable
offset) is at least ``min.cleanable.dirty.ratio``, or when its first dirty batch is older than
``max.compaction.lag.ms``; ``min.compaction.lag.ms``, the active segment, the high watermark
and the last stable offset bound the cleanable end. The rule itself is applied where the
segments are read (:func:`logstore.storage.cleaner.plan_cleaning`, step 3); this module
decides *with which settings*: each topic's own configs
(``<log_dir>/topic-configs/<topic>.properties``) over the broker defaults
(``broker.properties``: ``log.cleaner.min.cleanable.ratio``,
``log.cleaner.max.compaction.lag.ms``, ``log.cleaner.min.compaction.lag.ms``,
``log.cleaner.delete.retention.ms``, ``log.segment.bytes`` ...), and whether cleaning runs at
all (``log.cleaner.enable``, default true as in Kafka).

One decision point: ``jobs/compact.py --log`` decides per partition, run by hand or by the
``loglake_log_cleaning`` DAG alike; a partition that is not due is skipped and reported with
the reason (``--force`` cleans it anyway). Read-only; no state of its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from logstore.errors import InvalidConfigError, LoglakeError
from logstore.storage.cleaner import CleanerSettings
from logstore.storage.config import LogConfig
from logstore.storage.properties import parse_properties
from logstore.storage.topic_config import read_topic_config
from pipelines.config import read_pipeline_toml

__all__ = [
    "CLEANER_BROKER_KEYS",
    "CleanerDefaults",
    "broker_config_path",
    "cleaner_defaults",
    "load_cleaner_defaults",
    "topic_settings",
]

# broker key -> the topic key it is the default of (those LogConfig does not carry)
CLEANER_BROKER_KEYS: dict[str, str] = {
    "log.cleaner.min.cleanable.ratio": "min.cleanable.dirty.ratio",
    "log.cleaner.max.compaction.lag.ms": "max.compaction.lag.ms",
}
_ENABLE = "log.cleaner.enable"


@dataclass(frozen=True, slots=True)
class CleanerDefaults:
    """What the broker config says about cleaning: on or off, and the topic defaults.

    ``log_config``: the broker's default topic config (``log.segment.bytes``,
    ``log.cleaner.min.compaction.lag.ms`` ... as topic settings); ``props``: the defaults of
    the topic keys :class:`~logstore.storage.config.LogConfig` does not carry
    (``min.cleanable.dirty.ratio``, ``max.compaction.lag.ms``). Picklable: it travels to the
    Spark tasks.
    """

    enabled: bool = True
    log_config: LogConfig = field(default_factory=LogConfig)
    props: Mapping[str, str] = field(default_factory=dict)


def cleaner_defaults(broker_props: Mapping[str, str], *, source: str = "") -> CleanerDefaults:
    """:class:`CleanerDefaults` from a broker config's properties. Bad values (a ratio
    outside [0, 1], a lag < 1, ``log.cleaner.enable`` not true/false) raise
    :class:`~logstore.errors.InvalidConfigError` naming ``source``; other keys are the
    broker's business and are not checked here."""
    where = f" ({source})" if source else ""
    raw_enable = broker_props.get(_ENABLE, "true").strip().lower()
    if raw_enable not in ("true", "false"):
        raise InvalidConfigError(f"{_ENABLE} = {raw_enable!r}: must be true or false{where}")
    props = {
        topic_key: broker_props[key].strip()
        for key, topic_key in CLEANER_BROKER_KEYS.items()
        if key in broker_props
    }
    try:
        log_config = LogConfig.from_broker_properties(broker_props)
        CleanerSettings.from_topic(log_config, props)  # validates the two cleaner keys
    except LoglakeError as exc:  # CleanerSettings raises the base error
        raise InvalidConfigError(f"{exc}{where}") from None
    return CleanerDefaults(raw_enable == "true", log_config, props)


def load_cleaner_defaults(path: str | os.PathLike[str] | None) -> CleanerDefaults:
    """:func:`cleaner_defaults` of a ``broker.properties`` file; Kafka's defaults for None.
    A missing file is an :class:`~logstore.errors.InvalidConfigError` (a typo must not
    silently turn the broker's settings into Kafka's)."""
    if path is None:
        return CleanerDefaults()
    try:
        text = Path(path).read_bytes().decode("latin-1")
    except OSError as exc:
        raise InvalidConfigError(f"cannot read the broker config {path}: {exc.strerror}") from None
    return cleaner_defaults(parse_properties(text, source=str(path)), source=str(path))


def broker_config_path(pipeline_toml: str | os.PathLike[str], override: str | None = None) -> str:
    """The broker config the cleaner reads: ``override`` (``--broker-config``), else the
    pipeline's ``[retention] broker_config`` (the one broker config retention and maintenance
    read too), else the checkout's ``conf/broker.properties``."""
    if override:
        return override
    # retention's job module loads kio and Delta code: only when a default is needed
    from pipelines.retention.job import DEFAULT_BROKER_CONFIG  # noqa: PLC0415

    retention = read_pipeline_toml(Path(pipeline_toml)).get("retention", {})
    chosen = retention.get("broker_config") if isinstance(retention, dict) else None
    return str(chosen or DEFAULT_BROKER_CONFIG)


def topic_settings(
    log_dir: str | os.PathLike[str], topic: str, defaults: CleanerDefaults | None = None
) -> tuple[LogConfig, CleanerSettings]:
    """``topic``'s log config and cleaner settings: its own overrides over ``defaults``."""
    base = defaults if defaults is not None else CleanerDefaults()
    overrides = read_topic_config(log_dir, topic)
    config = LogConfig.from_properties(overrides, defaults=base.log_config)
    return config, CleanerSettings.from_topic(config, {**base.props, **overrides})
