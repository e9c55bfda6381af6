"""Errors of the Delta sink: one branch of ``LoglakeError`` per kind of refusal.

:func:`error_class` finds a class by its name, for errors that crossed a process boundary as
text (a job's result file).
"""

from __future__ import annotations

from logstore.errors import LoglakeError

__all__ = [
    "ConcurrentWriteError",
    "DeltaSinkError",
    "SchemaMismatchError",
    "StaleTransactionError",
    "error_class",
    "first_error_line",
]


class DeltaSinkError(LoglakeError):
    """A Delta write that the sink refused or could not commit."""


class SchemaMismatchError(DeltaSinkError):
    """The data's columns or types (or partition columns) differ from the table's."""


class StaleTransactionError(DeltaSinkError):
    """An app transaction would move backwards (a stale re-run), or progress moved under us."""


class ConcurrentWriteError(DeltaSinkError):
    """Another writer committed in between and retrying would not be equivalent to a serial run."""


_BY_NAME: dict[str, type[DeltaSinkError]] = {
    cls.__name__: cls
    for cls in (DeltaSinkError, SchemaMismatchError, StaleTransactionError, ConcurrentWriteError)
}


def error_class(name: str) -> type[DeltaSinkError]:
    """The sink's exception class called ``name`` (``DeltaSinkError`` for anything else)."""
    return _BY_NAME.get(name, DeltaSinkError)


def first_error_line(exc: BaseException) -> str:
    """The line of a (Spark/Py4J) exception's text naming the error, for one-line messages."""
    text = str(exc).strip()
    for line in text.splitlines():
        if "Error" in line or "Exception" in line:
            return line.strip()
    return text.splitlines()[0] if text else type(exc).__name__
