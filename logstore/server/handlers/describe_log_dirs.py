"""DescribeLogDirs (key 35), v1-v4: each log dir with its partitions' sizes and its volume.

What ``kafka-log-dirs.sh --describe`` and ``AdminClient.describeLogDirs`` ask: for every
directory of ``log.dirs`` (listed even when it holds no partition, as Kafka does), the
partitions it holds with ``partition_size`` (bytes of all segment files, Kafka's
``UnifiedLog.size``), ``offset_lag`` and ``is_future_key``. loglake has no replicas and no
``AlterReplicaLogDirs``, so no log is a future log and the lag of a current log
(``max(high watermark - log end offset, 0)`` in Kafka) is 0. From v4 (KIP-827) each dir also
carries ``total_bytes`` / ``usable_bytes`` of its volume (``statvfs``: blocks and blocks
available to unprivileged users, times the fragment size; -1 when the call fails).

``topics`` null = every partition; a named topic or partition the broker does not hold is
left out of the answer, as Kafka leaves it out. v0 is not served: Kafka 4.0 removed it
(KIP-896). Read-only: sizes are read without the logs' locks, so a size may be a segment
roll behind; Kafka's answer is equally a snapshot.

Authorization (with ``authorizer.class.name``): DESCRIBE on the cluster, else
``CLUSTER_AUTHORIZATION_FAILED`` with no results, as Kafka.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation
from logstore.server.security.authorizer import authorized_cluster

__all__ = ["API_KEY", "MAX_VERSION", "MIN_VERSION", "handle"]

API_KEY: Final = 35
MIN_VERSION: Final = 1
MAX_VERSION: Final = 4


def _volume(path: Path) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding ``path``; (-1, -1) when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1, -1
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def handle(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    if not authorized_cluster(ctx, AclOperation.DESCRIBE):
        # Kafka: DESCRIBE on the cluster; v3+ say so, older versions get nothing
        return build(
            mod.DescribeLogDirsResponse,
            throttle_time=ZERO_MS,
            error_code=ErrorCode.cluster_authorization_failed,
            results=(),
        )
    wanted: dict[str, set[int]] | None = None
    if request.topics is not None:
        wanted = {}
        for t in request.topics:
            wanted.setdefault(str(t.topic), set()).update(int(p) for p in t.partitions)
    manager = ctx.broker.log_manager
    # log dir -> topic -> [(partition, size)]
    by_dir: dict[Path, dict[str, list[tuple[int, int]]]] = {d: {} for d in manager.log_dirs}
    for lg in manager.all_logs():
        if wanted is not None and lg.partition not in wanted.get(lg.topic, ()):
            continue
        where = manager.log_dir_of(lg.topic, lg.partition)
        if where is None:  # deleted since all_logs() was taken
            continue
        by_dir.setdefault(where, {}).setdefault(lg.topic, []).append((lg.partition, lg.size))
    results = []
    for log_dir, topics in by_dir.items():
        total, usable = _volume(log_dir)
        results.append(
            build(
                mod.DescribeLogDirsResult,
                error_code=ErrorCode.none,
                log_dir=str(log_dir),
                topics=tuple(
                    build(
                        mod.DescribeLogDirsTopic,
                        name=topic,
                        partitions=tuple(
                            build(
                                mod.DescribeLogDirsPartition,
                                partition_index=p,
                                partition_size=size,
                                offset_lag=0,
                                is_future_key=False,
                            )
                            for p, size in sorted(parts)
                        ),
                    )
                    for topic, parts in sorted(topics.items())
                ),
                total_bytes=total,
                usable_bytes=usable,
            )
        )
    return build(
        mod.DescribeLogDirsResponse,
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        results=tuple(results),
    )
