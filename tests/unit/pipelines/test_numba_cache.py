"""numba's on-disk cache of the kernels lives in a directory per digest of the kernel modules'
sources (:mod:`pipelines.numba_cache`), so a changed callee never comes back as stale machine
code inlined in an unchanged caller.

No mock: the digest over real package trees in ``tmp_path``; the cache through real fresh
interpreters (a copy of ``pipelines`` on ``PYTHONPATH``, shadowing the installed one, with a
caller and an inlined callee added), against numba's default location, which keeps the bug.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines import numba_cache
from pipelines.numba_cache import holds, kernel_digest, kernel_modules, prune

ROOT = Path(__file__).resolve().parents[3]

CALLEE = """from numba import njit


@njit(inline="always")
def bump(x):
    return x + {step}
"""
CALLER = """from numba import njit

from {package}.probe_callee import bump


@njit(cache=True)
def run(x):
    return bump(x)
"""
# A fresh process: the caller's result, the cache hits of its one signature, numba's directory
PROBE = """import json, os, sys
package = sys.argv[1]
caller = __import__(package + ".probe_caller", fromlist=["run"])
value = caller.run(1)
print(json.dumps({{"value": int(value), "hits": sum(caller.run.stats.cache_hits.values()),
                  "dir": os.environ.get("NUMBA_CACHE_DIR")}}))
"""


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_digest_follows_kernel_modules_only(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "plain.py": "X = 1\n",
            "kern.py": "from numba import njit\n\n\n@njit\ndef f(x):\n    return x\n",
            "sub/__init__.py": "",
            "sub/lazy.py": "def g():\n    import numba\n\n    return numba\n",
            "sub/mentions.py": '"""Not a kernel: it uses numba_cache."""\n'
            "from pipelines import numba_cache\n",
            # not a package (no __init__.py): never imported as part of pkg, never read
            "assets/node_modules/x.py": "import numba\n",
        },
    )
    assert list(kernel_modules([pkg])) == ["pkg/kern.py", "pkg/sub/lazy.py"]
    before = kernel_digest([pkg])
    assert len(before) == 32

    # a non-kernel module, a non-package file and a new non-kernel module: same digest
    (pkg / "plain.py").write_text("X = 2\n")
    (pkg / "assets/node_modules/x.py").write_text("import numba\nY = 3\n")
    (pkg / "sub/more.py").write_text("Z = 1\n")
    assert kernel_digest([pkg]) == before

    # one byte of a kernel module: another digest, and back when it is undone
    kern = (pkg / "kern.py").read_text()
    (pkg / "kern.py").write_text(kern.replace("return x", "return x + 1"))
    changed = kernel_digest([pkg])
    assert changed != before
    (pkg / "kern.py").write_text(kern)
    assert kernel_digest([pkg]) == before

    # a module that starts to import numba, and a kernel module moved: other digests
    (pkg / "plain.py").write_text("import numba\n")
    assert kernel_digest([pkg]) not in {before, changed}
    (pkg / "plain.py").write_text("X = 2\n")
    (pkg / "sub/lazy.py").rename(pkg / "lazy.py")
    assert kernel_digest([pkg]) not in {before, changed}


def test_every_kernel_module_of_the_project_is_under_pipelines() -> None:
    """``pipelines/__init__.py`` configures the cache; a kernel module elsewhere (``logstore``)
    could be imported first and cache beside itself: its package must configure too."""
    modules = list(kernel_modules([ROOT / "pipelines", ROOT / "logstore"]))
    assert "pipelines/decode/_kernels.py" in modules
    assert "pipelines/typed/avro_kernel.py" in modules
    assert [m for m in modules if not m.startswith("pipelines/")] == []
    # and this process (pytest imported pipelines) caches there
    assert numba_cache.digest_directory() is not None
    assert numba_cache.digest_directory() == Path(os.environ["NUMBA_CACHE_DIR"])
    assert numba_cache.digest_directory().name == f"loglake-{numba_cache.current_digest()}"


def _probe(package: str, pythonpath: Path, env: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(), package],
        cwd=pythonpath,
        env={**env, "PYTHONPATH": str(pythonpath), "PYTHONDONTWRITEBYTECODE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_changed_callee_is_compiled_again_not_loaded_stale(tmp_path: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"NUMBA_CACHE_DIR", "LOGLAKE_NUMBA_CACHE_DIR", "LOGLAKE_CACHE_DIR"}
    }

    # numba's default location (__pycache__ beside the caller): the bug
    plain = _package(
        tmp_path / "plain",
        {
            "tiny/__init__.py": "",
            "tiny/probe_callee.py": CALLEE.format(step=1),
            "tiny/probe_caller.py": CALLER.format(package="tiny"),
        },
    )
    assert _probe("tiny", plain, env) == {"value": 2, "hits": 0, "dir": None}
    (plain / "tiny/probe_callee.py").write_text(CALLEE.format(step=100))
    assert _probe("tiny", plain, env) == {"value": 2, "hits": 1, "dir": None}  # stale

    # the same two modules in a copy of pipelines: its __init__ sets the cache up
    shadow = tmp_path / "shadow"
    shutil.copytree(
        ROOT / "pipelines",
        shadow / "pipelines",
        ignore=shutil.ignore_patterns("__pycache__", "docs_assets"),
    )
    _package(
        shadow / "pipelines",
        {
            "probe_callee.py": CALLEE.format(step=1),
            "probe_caller.py": CALLER.format(package="pipelines"),
        },
    )
    env["LOGLAKE_CACHE_DIR"] = str(tmp_path / "cache")
    first = _probe("pipelines", shadow, env)
    assert first["value"] == 2 and first["hits"] == 0
    again = _probe("pipelines", shadow, env)
    assert again == {**first, "hits": 1}  # the cache works: loaded, not compiled
    (shadow / "pipelines/probe_callee.py").write_text(CALLEE.format(step=100))
    changed = _probe("pipelines", shadow, env)
    assert changed["value"] == 101 and changed["hits"] == 0
    assert changed["dir"] != first["dir"]
    assert Path(str(changed["dir"])).parent == tmp_path / "cache" / "numba"
    assert not list((shadow / "pipelines").rglob("*.nbi"))  # nothing beside the modules
    assert _probe("pipelines", shadow, env) == {**changed, "hits": 1}


def test_a_users_numba_cache_dir_is_the_root_and_children_keep_the_directory(
    tmp_path: Path,
) -> None:
    """``NUMBA_CACHE_DIR`` set by the user: the digest directory goes under it. A child
    process inherits the directory the parent chose (not nested once more), and numba
    imported before ``pipelines`` reads the setting again."""
    env = {k: v for k, v in os.environ.items() if k != "LOGLAKE_NUMBA_CACHE_DIR"}
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    script = """
import json, os, subprocess, sys
import numba
import pipelines
child = subprocess.run(
    [sys.executable, "-c", "import os, pipelines; print(os.environ['NUMBA_CACHE_DIR'])"],
    capture_output=True, text=True, check=True,
)
print(json.dumps([os.environ["NUMBA_CACHE_DIR"], numba.config.CACHE_DIR, child.stdout.strip()]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    expected = str(tmp_path / "mine" / f"loglake-{numba_cache.current_digest()}")
    assert json.loads(done.stdout) == [expected, expected, expected]
    assert Path(expected).stat().st_mode & 0o777 == 0o700


def test_pruning_keeps_the_current_the_recent_and_what_is_not_a_digest(tmp_path: Path) -> None:
    day = 86400.0
    now = time.time()
    ages = {"a": 30, "b": 20, "c": 10, "d": 5, "e": 0.1}  # days since last use
    dirs = {}
    for letter, age in ages.items():
        path = tmp_path / f"loglake-{letter * 32}"
        (path / "decode_x").mkdir(parents=True)
        (path / "decode_x" / "k.nbi").write_bytes(b"index")
        os.utime(path, (now - age * day, now - age * day))
        dirs[letter] = path
    other = tmp_path / "loglake-not-a-digest"
    other.mkdir()
    os.utime(other, (now - 99 * day, now - 99 * day))
    (tmp_path / "decode_123").mkdir()  # numba's own layout under a user's NUMBA_CACHE_DIR

    # the current one is the oldest: still kept; of the others the most recent (keep=1) and
    # any used within 7 days are kept
    removed = prune(tmp_path, dirs["a"], keep=1, grace=7 * day)
    assert sorted(removed) == [dirs["b"], dirs["c"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [dirs["a"].name, dirs["d"].name, dirs["e"].name, other.name, "decode_123"]
    )
    assert (dirs["a"] / "decode_x" / "k.nbi").read_bytes() == b"index"

    # a root that is not there: nothing to do, no error
    assert prune(tmp_path / "missing", dirs["a"]) == []


def test_holds_answers_for_the_kernels_of_this_process_directory() -> None:
    with pytest.raises(ValueError, match="not a kernel of"):
        holds(["numpy.add"])
    with pytest.raises(ValueError, match="not a kernel of"):
        holds(["pipelines.run"])
    assert holds([])
