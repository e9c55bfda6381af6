"""The object store of ``make demo DEMO_ARGS=--s3``: moto's S3 server on 127.0.0.1, one bucket,
the demo's ``[storage]`` settings; and what the demo shows of its lake, wherever it is
(:func:`lake_tables`: each table's objects and Delta protocol).

The server (``python -m moto.server``, from ``moto[server]`` on PyPI: a real S3 REST endpoint
over HTTP, conditional writes included) runs in a child process on a free port, not in the
demo's process: some delta-rs reads hold the GIL while they wait for the store, and a server
in the same process could not answer them. Its objects live in its memory: the lake is gone
when the server stops, which the demo says.

moto comes with the project's pinned environment (``make setup`` installs the lock file's dev
group, which holds it); without it :meth:`LocalS3.start` raises a clear error instead of an
``ImportError``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from logstore.errors import LoglakeError
from logstore.objectstore import LakeLocation, StorageSettings, open_store

__all__ = ["BUCKET", "LocalS3", "TableSummary", "lake_tables", "wait_listening"]

BUCKET = "loglake-demo"
# the keys the demo's jobs send (moto accepts any; a real store would check them)
ACCESS_KEY = "loglake-demo"
SECRET_KEY = "loglake-demo-secret"
REGION = "us-east-1"


def wait_listening(proc: subprocess.Popen[bytes], port: int, what: str, log: Path) -> None:
    """Until ``proc`` accepts connections on 127.0.0.1:``port``; a :class:`LoglakeError`
    naming ``log`` if it exits first or after 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LoglakeError(f"{what} exited with {proc.returncode}; see {log}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.2)
    raise LoglakeError(f"{what} did not listen on {port} within 60 s; see {log}")


@dataclass
class LocalS3:
    """The server, once :meth:`start` ran: its port and process."""

    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def lake(self) -> str:
        return f"s3://{BUCKET}/lake"

    def storage_section(self) -> dict[str, str]:
        """The ``[storage]`` keys of the demo's pipeline TOML."""
        return {
            "endpoint_url": self.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": REGION,
        }

    def settings(self) -> StorageSettings:
        """Those keys alone (no environment), as a job resolves them."""
        return StorageSettings.from_environment(self.storage_section(), environ={})

    def start(self, port: int, log: Path) -> None:
        """The server on ``port`` (output to ``log``), then the bucket."""
        if importlib.util.find_spec("moto") is None:
            raise LoglakeError(
                "--s3 needs moto's S3 server (moto[server], in the lock file's dev group): "
                "run make setup"
            )
        self.port = port
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_listening(self.process, port, "the S3 server", log)
        import pyarrow.fs as pafs  # noqa: PLC0415

        pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            allow_bucket_creation=True,
        ).create_dir(BUCKET)

    def stop(self) -> None:
        """SIGTERM to the server (SIGKILL after 30 s); its objects go with it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass(frozen=True)
class TableSummary:
    """One table of the lake as the demo shows it: its name, version, objects and bytes (every
    object under its directory: data, log, change data, deletion vectors) and its Delta
    protocol (reader and writer versions, table features, change data feed on or not)."""

    name: str
    version: int
    objects: int
    size: int
    reader: int
    writer: int
    reader_features: tuple[str, ...]
    writer_features: tuple[str, ...]
    change_data_feed: bool

    def protocol(self) -> str:
        """``reader 3 [deletionVectors, ...] / writer 7 [...]``, and ``, change data feed``
        when the table property turns it on (below writer 7 it is not a named feature)."""
        text = f"reader {self.reader}"
        if self.reader_features:
            text += f" [{', '.join(self.reader_features)}]"
        text += f" / writer {self.writer}"
        if self.writer_features:
            text += f" [{', '.join(self.writer_features)}]"
        return text + (", change data feed" if self.change_data_feed else "")


def lake_tables(lake: str) -> list[TableSummary]:
    """Every table of ``lake`` (a directory or an object-store prefix; this process's storage
    settings), from one listing of its store and each table's latest snapshot."""
    from pipelines.catalog import find_tables, open_table  # noqa: PLC0415

    listing = open_store(LakeLocation.parse(lake)).list()
    root = LakeLocation.parse(lake).uri.rstrip("/")
    out = []
    for table in find_tables(lake):
        rel = LakeLocation.parse(table.path).uri[len(root) :].strip("/") + "/"
        objects = [o for o in listing if o.path.startswith(rel)]
        dt = open_table(table)
        p = dt.protocol()
        out.append(
            TableSummary(
                name=table.name,
                version=dt.version(),
                objects=len(objects),
                size=sum(o.size for o in objects),
                reader=p.min_reader_version,
                writer=p.min_writer_version,
                reader_features=tuple(sorted(p.reader_features or [])),
                writer_features=tuple(sorted(p.writer_features or [])),
                change_data_feed=dt.metadata().configuration.get("delta.enableChangeDataFeed")
                == "true",
            )
        )
    return out
