"""Where numba keeps the machine code of loglake's kernels: one directory per *digest* of the
sources of every kernel module, so that code compiled against other sources is never loaded.

Why: numba's on-disk cache (``@njit(cache=True)``) stamps an entry with the source of the
compiled function's own file only, yet the machine code holds its callees too, inlined or not
(``pipelines/decode/_kernels._varint`` in the Avro kernels, the codegen helpers, compaction's
selection...). Change a callee's module and not the caller's (an upgrade, a ``git pull``, an
edit) and numba loads the caller's old code with the old callee in it: silently stale results.
Here the cache directory is ``<root>/loglake-<digest>``, the digest being the SHA-256 of the
relative path and bytes of every module under ``pipelines/`` and ``logstore/`` that imports
numba (:func:`kernel_modules`): any change to any of them means a new, empty directory. numba
still checks each entry against its own file inside it.

How: :func:`configure` runs in ``pipelines/__init__.py``, so in every process before any kernel
module is imported (every kernel module is in ``pipelines``; a test holds it there): the driver,
``spark-submit`` jobs, Spark's Python workers (the daemon ``pipelines.spark_daemon`` configures
before it forks them, and they inherit it), the warm-up of ``tools/bootstrap.sh`` and pytest.
It sets ``NUMBA_CACHE_DIR``, which numba reads when it is imported (``numba/core/config.py``)
and again before each compilation if any ``NUMBA_*`` variable changed, while the directory of a
function is fixed when its ``@njit(cache=True)`` decorator runs, i.e. when its module is
imported (``_UserProvidedCacheLocator.from_function`` in ``numba/core/caching.py``). If numba
was imported first, its configuration is reloaded. Child processes inherit the variable.

The root: the user's own ``NUMBA_CACHE_DIR`` if set (the digest directory goes under it), else
``<user cache>/numba`` (:func:`user_cache_dir`: ``$LOGLAKE_CACHE_DIR``, ``$XDG_CACHE_HOME/loglake``
or ``~/.cache/loglake``; the generated Avro kernels live there too). A value this module set in a
parent process is recognised (``LOGLAKE_NUMBA_CACHE_DIR`` holds it) and its root reused. The
digest directory is created 0700 and refused unless owned by this user and not writable by
others (numba unpickles what it finds there); then a per-user directory under the system's
temporary directory is tried; failing both, numba's default (``__pycache__`` beside each
module) is left with a warning. Old digest directories are pruned when a new one is made
(:func:`prune`).

Cost: the digest reads every ``.py`` file of the two packages (246 files, 2.7 MB) and hashes
the 11 that import numba: 7-11 ms for :func:`configure` on the 2-core dev box at load ~2.8
(2026-11-28: listing 1.5 ms, reading 3.5-5, finding the imports 2.4; 4-5 ms in all at load ~1),
once per process: forked Spark workers inherit it from the daemon, and a job's ``--help``
imports the same standard modules anyway. Not cached by file stamps: reading is most of it and
a stamp file would be one more thing to trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "KERNEL_PACKAGES",
    "configure",
    "current_digest",
    "digest_directory",
    "holds",
    "kernel_digest",
    "kernel_modules",
    "private_directory",
    "prune",
    "user_cache_dir",
]

#: The packages whose numba modules the digest covers.
KERNEL_PACKAGES = ("pipelines", "logstore")

# Set to the directory this module chose, so that a child process (which inherits
# NUMBA_CACHE_DIR) tells its parent's choice from a user's own NUMBA_CACHE_DIR.
_OWN = "LOGLAKE_NUMBA_CACHE_DIR"
_PREFIX = "loglake-"
_DIGEST_NAME = re.compile(_PREFIX + "[0-9a-f]{32}")

# configure()'s answers, once per process: "directory" (Path | None), "digest" (str)
_STATE: dict[str, Any] = {}


def user_cache_dir() -> Path:
    """This user's loglake cache: ``$LOGLAKE_CACHE_DIR``, else ``$XDG_CACHE_HOME/loglake``,
    else ``~/.cache/loglake`` (not created here)."""
    base = os.environ.get("LOGLAKE_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "loglake"


def private_directory(path: Path) -> Path | None:
    """``path``, created 0700 with its parents if missing, or None if it cannot be created or
    is not this user's alone (another owner, or writable by group or others): what is found
    there is imported or unpickled, i.e. run."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    return path


def _python_files(directory: Path, out: list[Path]) -> None:
    """The ``.py`` files of the package at ``directory`` and of its subpackages (directories
    with an ``__init__.py``: not ``__pycache__`` nor asset trees such as the quality docs'
    ``node_modules``, 485 directories that made a plain walk cost 12 ms)."""
    subpackages = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".py"):
                out.append(Path(entry.path))
            elif entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                subpackages.append(Path(entry.path))
    for sub in subpackages:
        _python_files(sub, out)


def _uses_numba(text: bytes) -> bool:
    """Whether a line of ``text`` starts (after indentation) with ``from numba`` or ``import
    numba`` (a whole word): every module that compiles with numba imports it. Found by
    ``bytes.find`` of "numba", not by a ``^``-anchored multi-line regex, which costs ~6 ms over
    the two packages (it tries every position). A docstring line so worded only over-includes
    (invalidates more often)."""
    at = text.find(b"numba")
    while at >= 0:
        end = at + 5
        if end == len(text) or not (chr(text[end]).isalnum() or text[end] == ord("_")):
            words = text[text.rfind(b"\n", 0, at) + 1 : at].split()
            if words in ([b"from"], [b"import"]):
                return True
        at = text.find(b"numba", end)
    return False


def kernel_modules(packages: Iterable[Path]) -> dict[str, bytes]:
    """The modules under ``packages`` (package directories) that import numba: their paths
    relative to their package's parent (``pipelines/decode/_kernels.py``) to their bytes,
    sorted by path."""
    found = {}
    for package in packages:
        files: list[Path] = []
        _python_files(package, files)
        for path in files:
            with open(path, "rb", buffering=0) as f:
                text = f.readall()
            if _uses_numba(text):
                found[path.relative_to(package.parent).as_posix()] = text
    return dict(sorted(found.items()))


def kernel_digest(packages: Iterable[Path] | None = None) -> str:
    """32 hex digits of the SHA-256 of :func:`kernel_modules` of ``packages`` (default: where
    :data:`KERNEL_PACKAGES` are imported from), each module as its relative path and its
    bytes (length-prefixed): a renamed or moved kernel module changes it too."""
    h = hashlib.sha256()
    modules = kernel_modules(_installed_packages() if packages is None else packages)
    for name, text in modules.items():
        h.update(len(name).to_bytes(4, "big") + name.encode())
        h.update(len(text).to_bytes(8, "big") + text)
    return h.hexdigest()[:32]


def _installed_packages() -> list[Path]:
    """The directories :data:`KERNEL_PACKAGES` are imported from (found without importing
    them: ``pipelines`` is being imported when :func:`configure` runs)."""
    packages: list[Path] = []
    for name in KERNEL_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            packages.extend(Path(p) for p in spec.submodule_search_locations)
    return packages


def _root() -> list[Path]:
    """Where digest directories may go, in order of preference (module docstring)."""
    numba_dir = os.environ.get("NUMBA_CACHE_DIR")
    if numba_dir and numba_dir == os.environ.get(_OWN):
        roots = [Path(numba_dir).parent]  # a parent process's choice: its root
    elif numba_dir:
        roots = [Path(numba_dir)]  # the user's: the digest directory goes under it
    else:
        roots = [user_cache_dir() / "numba"]
    roots.append(Path(tempfile.gettempdir()) / f"loglake-numba-{os.getuid()}")
    return roots


def configure() -> Path | None:
    """Point numba's cache at the digest directory of the installed kernel modules (module
    docstring) and return it; None, with a warning, where no directory is usable (numba's
    default then). Once per process: later calls return the first answer. Never raises."""
    if "directory" not in _STATE:
        _STATE["directory"] = _configure()
    return digest_directory()


def _configure() -> Path | None:
    try:
        _STATE["digest"] = digest = kernel_digest()
    except OSError as exc:
        warnings.warn(
            f"loglake: numba's kernel cache stays beside the modules (digest of the kernel "
            f"sources unreadable: {exc}); a changed callee may be loaded stale",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    for root in _root():
        directory = root / f"{_PREFIX}{digest}"
        new = not directory.exists()
        if private_directory(directory) is None:
            continue
        if new:
            prune(root, directory)
        else:
            with contextlib.suppress(OSError):
                os.utime(directory)  # in use: pruned last (:func:`prune`)
        os.environ["NUMBA_CACHE_DIR"] = os.environ[_OWN] = str(directory)
        config = sys.modules.get("numba.core.config")
        if config is not None:  # numba imported first: read the variable again
            config.reload_config()
        return directory
    warnings.warn(
        f"loglake: numba's kernel cache stays beside the modules (no usable directory under "
        f"{', '.join(map(str, _root()))}); a changed callee may be loaded stale",
        RuntimeWarning,
        stacklevel=3,
    )
    return None


def digest_directory() -> Path | None:
    """The directory :func:`configure` chose in this process (None: numba's default)."""
    directory: Path | None = _STATE.get("directory")
    return directory


def current_digest() -> str:
    """The digest of the installed kernel modules, as :func:`configure` computed it (computed
    now if it could not: then an unreadable module raises ``OSError`` here)."""
    if "digest" not in _STATE:
        _STATE["digest"] = kernel_digest()
    return str(_STATE["digest"])


def prune(root: Path, current: Path, *, keep: int = 3, grace: float = 86400.0) -> list[Path]:
    """Remove the digest directories (``loglake-<32 hex>``) under ``root`` but ``current``,
    the ``keep`` most recently used others and any used in the last ``grace`` seconds (a
    directory's mtime: set by :func:`configure` in every process that uses it); returns what
    was removed. Why the grace: other checkouts on the machine (worktrees, an older install)
    have digests of their own and may be running; numba recreates a directory removed under
    a running process when it next saves, and only loses its cache. Errors are ignored (a
    prune never fails a run): what cannot be removed is left."""
    try:
        entries = [
            (entry.stat().st_mtime, Path(entry.path))
            for entry in os.scandir(root)
            if _DIGEST_NAME.fullmatch(entry.name)
            and entry.is_dir(follow_symlinks=False)
            and entry.path != str(current)
        ]
    except OSError:
        return []
    entries.sort(reverse=True)
    now = time.time()
    removed = []
    for mtime, path in entries[keep:]:
        if now - mtime > grace:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def holds(kernels: Iterable[str]) -> bool:
    """Whether this process's digest directory holds numba's index of each of ``kernels``
    (dotted: ``pipelines.decode._kernels.records_to_columns``), i.e. they were compiled
    against the current sources: ``tools/bootstrap.sh`` warms the cache only if not. The
    index's place is numba's: ``<parent dir>_<SHA-1 of the module's directory>/<module>.
    <function>-<line>.pyXY.nbi`` (``_CacheLocator.get_suitable_cache_subpath``)."""
    directory = digest_directory()
    if directory is None:
        return False
    packages = {p.name: p for p in _installed_packages()}
    for kernel in kernels:
        module, function = kernel.rsplit(".", 1)
        top, *rest = module.split(".")
        if top not in packages or not rest:
            raise ValueError(f"not a kernel of {KERNEL_PACKAGES}: {kernel!r}")
        source = packages[top].joinpath(*rest).with_suffix(".py")
        folder = os.path.dirname(os.path.abspath(source))
        sub = f"{os.path.basename(folder)}_{hashlib.sha1(folder.encode()).hexdigest()}"
        if not any((directory / sub).glob(f"{source.stem}.{function}-*.nbi")):
            return False
    return True
