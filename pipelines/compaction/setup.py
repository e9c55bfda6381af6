"""Table set-up: a compacted topic's table (and tombstone table) created empty when absent,
its settings (strategy, buckets) checked against the config, changed only by ``--full``.

delta-rs refuses table properties it does not know, so the settings live in the table's
description as JSON; the topic table takes the change data feed and, unless its config says
``deletion_vectors = false`` (``[compact.deletion_vectors]``), deletion vectors. Without them the
table's protocol stays at what the change data feed needs (reader 1, writer 4) and lists no
``deletionVectors`` reader feature, so readers without it (deltalake 1.6's
``to_pyarrow_table``) read the table; the feature is fixed when the table is created (Delta has
no simple way to drop a reader feature): changing the option later changes how runs write, not
the protocol (``pipelines.compaction.table``).
"""

from __future__ import annotations

import json
from typing import Any

from deltalake import DeltaTable

from logstore.errors import LoglakeError
from pipelines.compaction.layout import (
    BUCKET,
    CONF_BUCKETS,
    CONF_STRATEGY,
    TABLE_SCHEMA,
)
from pipelines.compaction.model import Strategy
from pipelines.delta.commit import create_table, load_table
from pipelines.delta.errors import DeltaSinkError

__all__ = ["ensure_table"]


def _settings(strategy: Strategy, buckets: int) -> str:
    return json.dumps({CONF_STRATEGY: str(strategy), CONF_BUCKETS: str(buckets)}, sort_keys=True)


def _create_table(
    path: str, strategy: Strategy, buckets: int, cdf: bool, deletion_vectors: bool
) -> None:
    # delta-rs refuses table properties it does not know: the settings go in the description.
    # The topic table (cdf) takes deletion vectors too unless told not to (incremental runs,
    # merge._merge_incremental).
    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else {}
    if cdf and deletion_vectors:
        configuration["delta.enableDeletionVectors"] = "true"
    create_table(
        path,
        TABLE_SCHEMA,
        [BUCKET],
        description=_settings(strategy, buckets),
        configuration=configuration or None,
    )


def _metadata_action(dt: DeltaTable, strategy: Strategy, buckets: int) -> dict[str, Any]:
    meta = dt.metadata()
    return {
        "id": meta.id,
        "name": meta.name,
        "description": _settings(strategy, buckets),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": dt.schema().to_json(),
        "partitionColumns": list(meta.partition_columns),
        "createdTime": meta.created_time,
        "configuration": dict(meta.configuration),
    }


def ensure_table(
    path: str,
    strategy: Strategy,
    buckets: int,
    *,
    full: bool,
    cdf: bool,
    deletion_vectors: bool = True,
) -> tuple[DeltaTable, int, dict[str, Any] | None]:
    """The table (created empty when absent; ``cdf``: with the change data feed, and deletion
    vectors if ``deletion_vectors``), its bucket count, and a metaData action when a ``--full``
    run changes the settings."""
    dt = load_table(path)
    if dt is None:
        _create_table(path, strategy, buckets, cdf, deletion_vectors)
        dt = load_table(path)
        if dt is None:
            raise DeltaSinkError("the table just created cannot be read", path=path)
    try:
        conf = json.loads(dt.metadata().description or "{}")
    except ValueError:
        conf = {}
    have = (conf.get(CONF_STRATEGY), conf.get(CONF_BUCKETS))
    want = (str(strategy), str(buckets))
    if have == want:
        return dt, buckets, None
    if not full:
        raise LoglakeError(
            f"table was built with strategy {have[0]!r} and {have[1]} buckets, the config says "
            f"{want[0]!r} and {want[1]}: re-run with --full to rebuild it",
            path=path,
        )
    return dt, buckets, _metadata_action(dt, strategy, buckets)
