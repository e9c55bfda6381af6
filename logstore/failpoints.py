"""Failpoints: named steps where a crash test kills the process, as a ``kill -9`` would.

One environment variable, ``LOGLAKE_FAILPOINT``, names the step (or several, comma-separated)
at which the process dies. Code marks a step with :func:`failpoint`::

    failpoint("tier.after_upload")          # the broker dies here when the test names it
    failpoint("compact.before_commit", kill=kill_session)   # a Spark job: the whole session

Why one module: crash tests must reach every step of every component the same way (the
broker's log cleaner and transaction coordinator, the jobs' commits, tiered uploads), so a
test that kills "between every two steps" lists the names and sets one variable. Names are
``<component>.<step>``; each module lists its steps in its docstring.

Killing: by default the process SIGKILLs itself (no ``finally``, no ``atexit``, no flush: what
a power cut or OOM kill leaves). ``before`` runs first when a step must leave durable state
exactly as a crash right after it would (e.g. flush a log the step just wrote). ``kill``
replaces the self-kill, e.g. with :func:`kill_session`, which also kills the Spark JVM and
Python workers of a job started as a session leader.

Cost when unset: one ``os.environ.get`` per call; failpoints sit on per-batch or per-commit
paths only, never per record.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable

__all__ = ["FAILPOINT_ENV", "armed", "failpoint", "kill_self", "kill_session"]

FAILPOINT_ENV = "LOGLAKE_FAILPOINT"

_log = logging.getLogger(__name__)


def armed(name: str) -> bool:
    """Whether ``LOGLAKE_FAILPOINT`` names step ``name``."""
    value = os.environ.get(FAILPOINT_ENV)
    if not value:
        return False
    return name in (part.strip() for part in value.split(","))


def kill_self() -> None:
    """SIGKILL this process (no clean-up of any kind)."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_session() -> None:
    """SIGKILL every process of this session (driver JVM, Python driver, daemon, workers).

    Crash tests start the job as a session leader (``start_new_session``); Spark's Python
    daemon moves to its own process group, so a process-group kill would miss the JVM.
    """
    sid = os.getsid(0)
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.getsid(int(entry)) == sid:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    os.kill(me, signal.SIGKILL)


def failpoint(
    name: str,
    *,
    before: Callable[[], object] | None = None,
    kill: Callable[[], None] = kill_self,
) -> None:
    """Die here when ``LOGLAKE_FAILPOINT`` names ``name``; otherwise do nothing.

    ``before`` runs first (e.g. a flush that a crash right after this step would have found
    on disk); ``kill`` does the killing (default: SIGKILL this process).
    """
    if not armed(name):
        return
    if before is not None:
        before()
    _log.error("failpoint %s: killing the process", name)
    kill()
