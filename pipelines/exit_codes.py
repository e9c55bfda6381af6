"""Exit codes of every job (``jobs/*.py``): one meaning per number, whichever job exits.

A scheduler decides from the code alone whether a retry can help. Codes in
:data:`NON_RETRIABLE` mean that running the same command again gives the same failure (the
arguments, the configuration or the data must change first), so Airflow fails the task at
once; :data:`EXIT_FAILED` is a failure that may pass on a retry (a broker or store that did
not answer, a full disk, a lost executor) and is retried with backoff.

| code | name | meaning | retried |
|---|---|---|---|
| 0 | EXIT_OK | the run did what it was asked | - |
| 1 | EXIT_FAILED | a failure that may be transient | yes |
| 2 | EXIT_USAGE | bad arguments or configuration, a missing topic | no |
| 3 | EXIT_CORRUPT | damaged batches found under ``--fail-on-corrupt`` | no |
| 4 | EXIT_DIVERGED | a log went backwards under the lake (``on_divergence = "fail"``) | no |
| 5 | EXIT_QUALITY | a quality suite failed | no |
| 6 | EXIT_INDEX_MISMATCH | a broker index disagrees with its log (lookups) | no |

The Airflow DAG file cannot import this module (its own environment); it keeps a copy of
:data:`NON_RETRIABLE` that a test compares with this one.
"""

from __future__ import annotations

import textwrap

__all__ = [
    "EXIT_CORRUPT",
    "EXIT_DIVERGED",
    "EXIT_FAILED",
    "EXIT_INDEX_MISMATCH",
    "EXIT_OK",
    "EXIT_QUALITY",
    "EXIT_USAGE",
    "MEANINGS",
    "NON_RETRIABLE",
    "epilog",
]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # argparse's own code for bad arguments
EXIT_CORRUPT = 3
EXIT_DIVERGED = 4
EXIT_QUALITY = 5
EXIT_INDEX_MISMATCH = 6

NON_RETRIABLE: frozenset[int] = frozenset(
    {EXIT_USAGE, EXIT_CORRUPT, EXIT_DIVERGED, EXIT_QUALITY, EXIT_INDEX_MISMATCH}
)

# One line per code: the README's table and every job's --help say the same.
MEANINGS: dict[int, str] = {
    EXIT_OK: "done",
    EXIT_FAILED: "failed; may pass on a retry",
    EXIT_USAGE: "bad arguments or configuration (the message names the option or key, the "
    "value and what was expected)",
    EXIT_CORRUPT: "damaged data: batches found under --fail-on-corrupt, or that a job cannot "
    "read past",
    EXIT_DIVERGED: "a log went backwards under the lake",
    EXIT_QUALITY: "a quality suite failed",
    EXIT_INDEX_MISMATCH: "a broker index disagrees with its log",
}


def epilog(details: dict[int, str]) -> str:
    """The ``Exit codes:`` paragraph of a job's ``--help``: 0, 1 and 2 (every job), then the
    codes of ``details``, each with its meaning and the job's own detail (``details`` may
    also add a detail to 0, 1 or 2). Codes 2-6 are marked as not retried."""
    lines = ["Exit codes: (2-6 are not retried: the same command fails the same way)"]
    for code in sorted({EXIT_OK, EXIT_FAILED, EXIT_USAGE, *details}):
        text = MEANINGS[code] + (f"; {details[code]}" if code in details else "")
        lines.append(textwrap.fill(f"{code} {text}", width=92, initial_indent="  ",
                                   subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=False))  # fmt: skip
    return "\n".join(lines)
