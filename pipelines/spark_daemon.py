"""pyspark's worker daemon, minus the traceback it prints when Spark hung up first.

Spark 4.2's ``pyspark/daemon.py`` flushes a worker's output once more after its task; when
the JVM has already closed that connection (at the end of a job, tearing its workers down),
the flush raises ``BrokenPipeError`` and, with ``spark.python.daemon.killWorkerOnFlushFailure``
(default true, SPARK-54344), the daemon prints the traceback and ends the worker. Nothing
failed: the task's results were already read. Users saw such tracebacks after successful
ingest runs, now and then.

This module (``spark.python.daemon.module pipelines.spark_daemon`` in
``conf/spark-defaults.conf``) runs pyspark's daemon unchanged except that a worker whose
connection the JVM closed (``BrokenPipeError``, ``ConnectionResetError``) ends quietly with
exit code 1, exactly as the daemon would end it. Any other error still prints its traceback.
Spark's *planner* workers of Python data sources do not use this setting (SparkEnv starts
them with pyspark's own daemon), which is why the jobs do not use the Python Data Source API.
"""

from __future__ import annotations

import socket

import pyspark.daemon as _daemon

_worker = _daemon.worker


def _quiet_worker(sock: socket.socket, authenticated: bool) -> int:
    try:
        return int(_worker(sock, authenticated) or 0)
    except (BrokenPipeError, ConnectionResetError):
        return 1  # the JVM hung up first; the daemon ends this worker (no reuse)


_daemon.worker = _quiet_worker

if __name__ == "__main__":
    _daemon.manager()
