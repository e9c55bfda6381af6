"""The quality run's file context on an object store: a local copy of ``<lake>/_quality``.

Great Expectations' file context (suites, Checkpoints, validation results) and its Data Docs
site are plain directories written with ``open()``: GX has no object-store backend for them
that loglake's storage settings would reach. On an ``s3://`` lake the run therefore works in a
local temporary directory: :func:`pull` copies ``<lake>/_quality/`` there first (so Data Docs
keep every earlier run and GX finds its suites), and :func:`push` uploads, after the run,
every file it wrote or changed, through :class:`~logstore.objectstore.ObjectStore` (bounded
retries; one PUT per file, each atomic).

Crash behaviour: a run that dies before :func:`push` uploads nothing: the lake's
``_quality/`` stays as the last run left it (its ``quality_results`` rows, committed suite by
suite to the Delta table, may be ahead of the pages: the next run's pages list them). A push
that fails part-way leaves some new pages in place and raises; the next run uploads them all
again. Not safe with two runs at once on one lake (as on disk).
"""

from __future__ import annotations

import os
from pathlib import Path

from logstore.objectstore import LakeLocation, ObjectStore

__all__ = ["Pulled", "pull", "push"]

# relative path -> (size, mtime_ns) of each file as pull left it
Pulled = dict[str, tuple[int, int]]


def pull(remote: LakeLocation, local: Path) -> Pulled:
    """Copy every object below ``remote`` into ``local``; what was copied."""
    store = ObjectStore(remote)
    pulled: Pulled = {}
    for info in store.list():
        target = local / info.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read(info.path))
        st = target.stat()
        pulled[info.path] = (st.st_size, st.st_mtime_ns)
    return pulled


def push(local: Path, remote: LakeLocation, pulled: Pulled) -> list[str]:
    """Upload every file below ``local`` that :func:`pull` did not leave as it is; the
    relative paths uploaded."""
    store = ObjectStore(remote)
    sent: list[str] = []
    for dirpath, _dirs, files in os.walk(local):
        for name in files:
            path = Path(dirpath) / name
            rel = path.relative_to(local).as_posix()
            st = path.stat()
            if pulled.get(rel) == (st.st_size, st.st_mtime_ns):
                continue
            store.write(rel, path.read_bytes())
            sent.append(rel)
    return sorted(sent)
