#!/usr/bin/env bash
# Installs everything loglake needs into ./.venv from the lock file (uv.lock), pinned.
# Safe to run any number of times: a second run finds everything in place and returns quickly.
# Fails with a clear message when Python 3.11+ or Java 17+ is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { printf 'loglake setup: %s\n' "$*" >&2; exit 1; }

# 1. Python 3.11 or 3.12 (pyspark 4.2 and the pinned wheels support both).
PY=""
for cand in "${LOGLAKE_PYTHON:-}" python3.11 python3.12 python3; do
  [ -n "$cand" ] || continue
  if command -v "$cand" >/dev/null 2>&1 &&
     "$cand" -c 'import sys; sys.exit(0 if (3, 11) <= sys.version_info[:2] < (3, 13) else 1)' 2>/dev/null; then
    # The real interpreter, not a shim (pyenv): uv recreates .venv whenever the path it is
    # given differs from the one the venv was made with.
    PY=$("$cand" -c 'import sys; print(sys.executable)'); break
  fi
done
if [ -z "$PY" ]; then
  found=none
  command -v python3 >/dev/null 2>&1 && found=$(python3 --version 2>&1)
  die "Python 3.11 or 3.12 is required (python3 on PATH: $found). Install it, or point LOGLAKE_PYTHON at one."
fi

# 2. Java 17+ for Spark.
command -v java >/dev/null 2>&1 || die "Java 17 is required for Spark and was not found on PATH (Debian: apt-get install openjdk-17-jre-headless)."
jv=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
[ -n "$jv" ] && [ "$jv" -ge 17 ] || die "Java 17+ is required for Spark; found: $(java -version 2>&1 | head -1)"

# 3. uv, pinned, in a private tool environment.
UV_VERSION=0.13.8
if ! { [ -x .tools/bin/uv ] && [ "$(.tools/bin/uv --version | cut -d' ' -f2)" = "$UV_VERSION" ]; }; then
  "$PY" -m venv .tools
  .tools/bin/python -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

# 4. The project and its pinned dependencies (dev group included: the tests need real clients).
.tools/bin/uv sync --frozen --quiet --python "$PY"

# 5. Bytecode, written once here: with PYTHONDONTWRITEBYTECODE set (as on these machines)
# nothing else ever writes it, and every fresh interpreter (each Spark Python worker, each
# spark-submit, the broker) compiled pandas, numba, pyspark... from source again: ~3 s more
# per process start. Site-packages again only when the lock changes; our own code each time
# (up-to-date files are skipped).
stamp=.venv/.loglake-bytecode
if [ ! -f "$stamp" ] || [ uv.lock -nt "$stamp" ]; then
  # Not every file in site-packages is meant to compile (test data, other Pythons' code),
  # so compileall's exit status says nothing here; what did compile is what counts.
  .venv/bin/python -m compileall -q -j 0 .venv/lib/python*/site-packages >/dev/null || true
  touch "$stamp"
fi
.venv/bin/python -m compileall -q -j 0 logstore pipelines jobs >/dev/null

# 6. An ingest task's numba kernels (decoder, Parquet writer) and a decode task's (the typed
# tables' Avro and Protobuf kernels) into numba's on-disk cache, once per change of any kernel
# module: otherwise the first job compiles them in every Python worker (~6 s). The cache is a
# directory per digest of the kernel modules' sources (pipelines/numba_cache.py); Python says
# whether the current one holds them (~0.1 s; a changed kernel module means a new, empty one).
if ! .venv/bin/python -c 'import sys; from pipelines.numba_cache import holds; sys.exit(not holds(sys.argv[1:]))' \
    pipelines.decode._kernels.records_to_columns pipelines.delta._parquet_kernels.plain_binary \
    pipelines.typed.avro_kernel.decode_rows pipelines.typed.protobuf_kernel.decode_rows; then
  .venv/bin/python -m pipelines.decode.warmup
fi

# 7. The Airflow environment: its own pins (airflow/pyproject.toml, airflow/uv.lock) in its own
# airflow/.venv. Never in .venv: the Spark provider pulls pyspark-client, which shares files with
# pyspark and silently corrupts it. The DAGs call .venv's spark-submit by path. Synced again
# only when its lock changes (the stamp); bytecode written once, as for .venv (step 5).
af_stamp=airflow/.venv/.loglake-synced
if [ ! -f "$af_stamp" ] || [ airflow/uv.lock -nt "$af_stamp" ] || [ airflow/pyproject.toml -nt "$af_stamp" ]; then
  (cd airflow && ../.tools/bin/uv sync --frozen --quiet --python "$PY")
  airflow/.venv/bin/python -m compileall -q -j 0 airflow/.venv/lib/python*/site-packages >/dev/null || true
  touch "$af_stamp"
fi

# 8. The JavaScript Kafka clients of the broker tests (tests/integration/broker/test_js_clients.py),
# pinned by tests/clients/js/package-lock.json: `npm ci` installs exactly the lock, again only
# when the lock changes (the stamp).
js=tests/clients/js
command -v npm >/dev/null 2>&1 || die "Node.js 20+ and npm are required for the JavaScript client tests ($js); not found on PATH (Debian: apt-get install nodejs npm)."
if [ ! -f "$js/node_modules/.loglake-installed" ] || [ "$js/package-lock.json" -nt "$js/node_modules/.loglake-installed" ]; then
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$js/node_modules/.loglake-installed"
fi

# 9. Data Docs offline: the CSS/JS that Great Expectations' pages load from public CDNs, pinned
# by pipelines/quality/docs_assets/package-lock.json; the quality job copies them into the
# site (pipelines/quality/docs_site.py). Installed again only when the lock changes. Then the
# headless Chromium the Data Docs test renders the site with (Debian's chromium package,
# installed when missing and we are root, as on CI; `apt-get update` only if the install
# needs it).
assets=pipelines/quality/docs_assets
command -v npm >/dev/null 2>&1 || die "npm is required for the Data Docs assets (Debian: apt-get install npm)."
if [ ! -f "$assets/node_modules/.package-lock.json" ] || [ "$assets/package-lock.json" -nt "$assets/node_modules/.package-lock.json" ]; then
  (cd "$assets" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null) ||
    die "npm ci failed in $assets (is the npm registry reachable?)"
fi
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; } ||
      die "apt-get install chromium failed (the Data Docs test needs it)"
  else
    printf 'loglake setup: note: chromium is missing; the Data Docs test needs it (Debian: sudo apt-get install chromium)\n' >&2
  fi
fi
