"""``make demo --s3``'s object store: moto's S3 server on 127.0.0.1, one bucket, the demo's
``[storage]`` settings.

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

__all__ = ["BUCKET", "LocalS3", "lake_contents", "wait_listening"]

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


def lake_contents(lake: str) -> list[tuple[str, int, int]]:
    """``(directory, objects, bytes)`` per top-level directory of ``lake`` (``topics/<name>``
    per topic table), from one listing of its store (this process's storage settings)."""
    per: dict[str, list[int]] = {}
    for obj in open_store(LakeLocation.parse(lake)).list():
        parts = obj.path.split("/")
        top = "/".join(parts[:2]) if parts[0] == "topics" and len(parts) > 2 else parts[0]
        n = per.setdefault(top, [0, 0])
        n[0] += 1
        n[1] += obj.size
    return [(name, n[0], n[1]) for name, n in sorted(per.items())]
