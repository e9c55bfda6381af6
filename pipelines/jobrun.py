"""The one job runner: every ``jobs/<name>.py`` is arguments, then :func:`run_job` over one
call, which checks the configuration first and turns what escapes into an exit code of
:mod:`pipelines.exit_codes`.

Order of a run (why): 1. the arguments (argparse exits 2 by itself); 2. the configuration file,
read and checked whole against :data:`pipelines.config.SECTIONS` before the job imports
Spark, Delta or the decoder, so a bad key or value exits 2 in a fraction of a second and the
job has done nothing; its ``[storage]`` over the AWS environment become the run's
object-store settings (:func:`logstore.objectstore.use_job_settings`), which every lake call
of the run uses, until the run ends; 3. the job's body, which imports what it needs, starts
its session and returns its code (0, or 5/6 from a result it read: a failed suite, index
problems).

Exceptions -> codes (:data:`EXIT_FOR`, first match wins, most specific first): a bad
configuration or named topic -> 2, damaged data -> 3, a diverged log -> 4, any other
:class:`~logstore.errors.LoglakeError` or ``OSError`` -> 1 (may pass on a retry). One line
``<job> failed: <message>`` goes to stderr. Anything else is a bug: it propagates with its
traceback (Python exits 1, a retried code: a bug may be a transient one's symptom).

Classes from modules a job imports late (``pipelines.divergence`` pulls in Arrow and Delta)
are named, not imported: a class whose module is not loaded cannot have been raised, so the
runner looks it up in ``sys.modules`` only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from logstore.errors import CorruptRecordError, InvalidConfigError, InvalidTopicError
from logstore.objectstore import use_job_settings
from pipelines.config import MissingTopicsError, read_pipeline_toml, storage_settings
from pipelines.exit_codes import EXIT_CORRUPT, EXIT_DIVERGED, EXIT_FAILED, EXIT_USAGE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["EXIT_FOR", "exit_code_for", "job_spark", "run_job"]

# (module, class name) -> exit code; checked in this order.
EXIT_FOR: tuple[tuple[str, str, int], ...] = (
    ("logstore.errors", InvalidConfigError.__name__, EXIT_USAGE),
    ("pipelines.config", MissingTopicsError.__name__, EXIT_USAGE),
    ("logstore.errors", InvalidTopicError.__name__, EXIT_USAGE),
    ("logstore.errors", CorruptRecordError.__name__, EXIT_CORRUPT),
    ("pipelines.divergence", "DivergenceError", EXIT_DIVERGED),
    ("logstore.errors", "LoglakeError", EXIT_FAILED),
    ("builtins", "OSError", EXIT_FAILED),
)


def exit_code_for(exc: BaseException) -> int | None:
    """The exit code of ``exc`` by :data:`EXIT_FOR`; None: not an expected failure."""
    for module_name, class_name, code in EXIT_FOR:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type) and isinstance(exc, cls):
            return code
    return None


def run_job(name: str, config: str | None, body: Callable[[], int]) -> int:
    """Check the pipeline TOML at ``config`` (None: the job has none), then run ``body`` and
    return its code, or the code of what it raised (see the module docstring)."""
    try:
        if config is not None:
            # one set of object-store settings for the whole run: the environment and [storage]
            use_job_settings(storage_settings(read_pipeline_toml(config), config))
        return body()
    except Exception as exc:
        code = exit_code_for(exc)
        if code is None:
            raise
        print(f"{name} failed: {exc}", file=sys.stderr, flush=True)
        return code
    finally:
        use_job_settings(None)  # the run's settings end with it (tests run jobs in-process)


def job_spark(
    app_name: str,
    *,
    master: str | None,
    spark_conf: Mapping[str, str],
    verbose: bool,
) -> SparkSession:
    """The job's Spark session (``[spark]`` master and conf; Spark's INFO lines with
    ``--verbose``). Jobs read the lake through their own readers, so no Delta reader."""
    from pipelines.session import get_spark  # noqa: PLC0415
    from pipelines.session import spark_conf as with_verbose  # noqa: PLC0415

    return get_spark(
        app_name,
        master=master,
        conf=with_verbose(spark_conf, verbose=verbose),
        delta_reader=False,
    )
