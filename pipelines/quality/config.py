"""The ``[quality]`` section of ``conf/pipeline.toml``: thresholds of the quality suites.

Every key is optional; a key that does not exist is refused, naming the nearest valid one.

``actions``: the users' own GX Actions, run by every quality Checkpoint after loglake's (see
:mod:`pipelines.quality.actions`), as an array of tables::

    [[quality.actions]]
    class = "my_alerts.actions.PageOnFailure"   # a ValidationAction subclass the job imports
    name = "page"                               # optional (default: the class name)
    channel = "#data"                           # every other key: a field of that class
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore.errors import InvalidConfigError
from pipelines.config import read_pipeline_toml

__all__ = ["QualityConfig", "load_quality_config"]


@dataclass(frozen=True)
class QualityConfig:
    """Thresholds of the suites (see ``conf/pipeline.toml`` ``[quality]`` for each key).

    ``max_future_skew_s``: a record's timestamp may be at most this many seconds after its
    ingest time (Kafka's ``message.timestamp.after.max.ms``, KIP-937, defaults to 1 h).
    ``max_past_skew_s``: at most this many seconds before it; None = no bound (Kafka's
    ``message.timestamp.before.max.ms`` defaults to unbounded: old data is normal).
    ``max_quarantined_batches``: rows the ``quarantine`` table may hold.
    ``docs``: build the Data Docs site under ``<lake>/_quality/data_docs``.
    ``max_dead_letter_rate``: ``[decode] max_dead_letter_rate``, dead letters per record
    decoded of each typed table's topic.
    ``actions``: the users' Actions (``class`` and fields), checked for shape only here: the
    classes are imported by the run (importing them loads Great Expectations).
    """

    max_future_skew_s: float = 3600.0
    max_past_skew_s: float | None = None
    max_quarantined_batches: int = 0
    docs: bool = True
    actions: tuple[dict[str, Any], ...] = ()
    max_dead_letter_rate: float = 0.01


_CLASS_PATH = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*[.:][A-Za-z_]\w*$")


def _actions(section: dict[str, Any], path: Path) -> tuple[dict[str, Any], ...]:
    specs = section.get("actions", [])
    if not isinstance(specs, list):
        raise InvalidConfigError(
            "[quality] actions must be an array of tables ([[quality.actions]])", path=str(path)
        )
    for i, spec in enumerate(specs):
        where = f"[quality] actions[{i}]"
        if not isinstance(spec, dict):
            raise InvalidConfigError(f"{where} must be a table, got {spec!r}", path=str(path))
        cls = spec.get("class")
        if not isinstance(cls, str) or not _CLASS_PATH.match(cls):
            raise InvalidConfigError(
                f'{where} needs class = "package.module.ClassName", got {cls!r}', path=str(path)
            )
        if "type" in spec:
            raise InvalidConfigError(f"{where}: type is the class's own; remove it", path=str(path))
    return tuple(specs)


def _number(section: dict[str, Any], key: str, path: Path, default: Any) -> Any:
    value = section.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidConfigError(
            f"[quality] {key} must be a number >= 0, got {value!r}", path=str(path)
        )
    return value


def load_quality_config(path: str | Path) -> QualityConfig:
    """Read ``[quality]`` of a pipeline TOML file (defaults when the section is absent)."""
    p = Path(path)
    data = read_pipeline_toml(p)
    section = data.get("quality", {})
    docs = section.get("docs", True)
    if not isinstance(docs, bool):
        raise InvalidConfigError(f"[quality] docs must be true or false, got {docs!r}", path=str(p))
    quarantined = _number(section, "max_quarantined_batches", p, 0)
    if int(quarantined) != quarantined:
        raise InvalidConfigError(
            f"[quality] max_quarantined_batches must be an integer, got {quarantined!r}",
            path=str(p),
        )
    past = _number(section, "max_past_skew_s", p, None)
    return QualityConfig(
        max_future_skew_s=float(_number(section, "max_future_skew_s", p, 3600.0)),
        max_past_skew_s=None if past is None else float(past),
        max_quarantined_batches=int(quarantined),
        docs=docs,
        actions=_actions(section, p),
        max_dead_letter_rate=float(data.get("decode", {}).get("max_dead_letter_rate", 0.01)),
    )
