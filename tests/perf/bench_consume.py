"""Consume throughput from the broker vs a raw ``sendfile`` of the same segment files.

Set-up: ``--mb`` MiB of lz4 batches (1 KiB values) in one partition, produced through the
broker with confluent-kafka. Then, in the same run:

1. **broker**: a protocol-level consumer (Fetch v4, ``--partition-max-mb`` (default 4 MiB)
   per partition per request, ``max_bytes`` 64 MiB, one request in flight like Kafka
   consumers per broker) reads the partition from offset 0 to the end; bytes are received
   into a reused buffer; the reader checks that each response's records field ends exactly
   at the end of the frame and walks the batch headers (base offset, length, magic, last
   offset delta: no Python objects per batch) to find the next offset after the last whole
   batch (a cut trailing batch is fetched again, as Kafka consumers do). Five passes
   interleaved with the baseline's, the best of each counts.
2. **raw sendfile baseline**: a separate process serving the same ``.log`` files with
   ``os.sendfile`` (same chunk size) over a loopback socket to the same kind of reader, with
   no request/response round trips at all (the cost the broker's protocol adds is exactly
   what the ratio measures).
3. **request/response floor** (reference, not the target): a separate process answering
   each 12-byte request (file, position) with one ``os.sendfile`` of ``--partition-max-mb`` —
   the same one-request-in-flight round trips as Fetch, with none of the broker's work
   (no parsing, index lookup or Python between requests). ``broker_vs_request_response``
   shows how much of the gap to the raw stream is the broker, and how much the round trips.
4. **confluent-kafka consumer** (records decoded in librdkafka, handed to Python) for scale.

Last line: one JSON object with MB/s of each and ``ratio_vs_raw_sendfile`` (target >= 0.7),
the fetch size used and the load average at the end (the machine may be shared).

    .venv/bin/python tests/perf/bench_consume.py [--mb 256] [--partition-max-mb 4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import confluent_kafka as ck  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from logstore.protocol.batch import HEADER_SIZE, LOG_OVERHEAD, MAGIC  # noqa: E402
from tests.fixtures.broker import BrokerProcess  # noqa: E402

TOPIC = "bench-consume"
PART_MAX = 4 * 1024 * 1024
PASSES = 5
_BATCH_START = struct.Struct(">qi")  # baseOffset, batchLength
_I32 = struct.Struct(">i")
_MAGIC_AT = 16
_LAST_OFFSET_DELTA_AT = 23
_PART_HEAD = struct.Struct(">ihqqi")  # index, error, high watermark, LSO, aborted count
_ABORTED_ENTRY = 16  # producer_id i64, first_offset i64
RCVBUF = 4 * 1024 * 1024


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while view:
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("closed")
        view = view[n:]


def next_offset(buf: bytearray, pos: int, end: int) -> tuple[int, int]:
    """``(offset after the last whole v2 batch in buf[pos:end], bytes of whole batches)``.

    Walks the batch headers in place; a trailing batch cut by the fetch size is left for the
    next request. Raises when no whole batch is there (no progress) or a magic is not 2.
    """
    start = pos
    nxt = -1
    while pos + HEADER_SIZE <= end:
        base, length = _BATCH_START.unpack_from(buf, pos)
        size = length + LOG_OVERHEAD
        if buf[pos + _MAGIC_AT] != MAGIC or size < HEADER_SIZE:
            raise RuntimeError(f"not a v2 batch at {pos}")
        if pos + size > end:
            break
        nxt = base + _I32.unpack_from(buf, pos + _LAST_OFFSET_DELTA_AT)[0] + 1
        pos += size
    if nxt < 0:
        raise RuntimeError("no whole batch in the response: no progress")
    return nxt, pos - start


def fetch_v4(
    topic: str, offset: int, correlation_id: int, part_max: int, isolation: int = 0
) -> bytes:
    """A Fetch v4 request for partition 0 of ``topic`` from ``offset``: max wait 500 ms, min 1
    byte, max 64 MiB, ``part_max`` for the partition, ``isolation`` 0 (read_uncommitted) or 1
    (read_committed)."""
    name = topic.encode()
    body = (
        struct.pack(">hhih", 1, 4, correlation_id, 5)
        + b"bench"
        + struct.pack(">iiiib", -1, 500, 1, 64 * 1024 * 1024, isolation)  # replica .. isolation
        + struct.pack(">ih", 1, len(name))
        + name
        + struct.pack(">iiqi", 1, 0, offset, part_max)
    )
    return struct.pack(">i", len(body)) + body


def connect(port: int, rcvbuf: int | None = RCVBUF) -> socket.socket:
    """A loopback connection to ``port``, with ``rcvbuf`` as SO_RCVBUF (None: the default)."""
    s = socket.create_connection(("127.0.0.1", port))
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return s


def fetch_pass(
    port: int,
    topic: str,
    end_offset: int,
    part_max: int = PART_MAX,
    *,
    isolation: int = 0,
    rcvbuf: int | None = RCVBUF,
) -> tuple[float, int, int]:
    """Fetch partition 0 of ``topic`` from 0 to ``end_offset``, one request in flight:
    (seconds, bytes of whole batches received, aborted-transaction entries received).

    Each response's records field must end exactly at the end of the frame. A batch cut at
    the end of a response is counted once, when it arrives whole, so the byte count equals the
    size of the log's segments when every batch was received.
    """
    buf = bytearray(part_max + 64 * 1024)
    head = bytearray(4)
    total = 0
    aborted = 0
    offset = 0
    cid = 0
    with connect(port, rcvbuf) as s:
        t0 = time.perf_counter()
        while offset < end_offset:
            cid += 1
            s.sendall(fetch_v4(topic, offset, cid, part_max, isolation))
            _recv_into(s, memoryview(head))
            (size,) = struct.unpack(">i", head)
            if size > len(buf):
                buf = bytearray(size)
            view = memoryview(buf)[:size]
            _recv_into(s, view)
            pos = 4 + 4 + 4  # correlation id, throttle, topic count
            (nlen,) = struct.unpack_from(">h", buf, pos)
            pos += 2 + nlen + 4  # topic name, partition count
            _idx, err, _hw, _lso, n_aborted = _PART_HEAD.unpack_from(buf, pos)
            pos += _PART_HEAD.size
            if err:
                raise RuntimeError(f"fetch error {err}")
            if n_aborted > 0:  # -1: a null array
                aborted += n_aborted
                pos += n_aborted * _ABORTED_ENTRY
            (rlen,) = _I32.unpack_from(buf, pos)
            pos += 4
            if pos + rlen != size:
                raise RuntimeError(f"records field ends at {pos + rlen}, frame at {size}")
            offset, whole = next_offset(buf, pos, pos + rlen)
            total += whole
            view.release()
        return time.perf_counter() - t0, total, aborted


_SERVER = """
import os, socket, sys
chunk = int(sys.argv[1])
files = sys.argv[2:]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
for f in files:
    with open(f, "rb") as fh:
        pos, left = 0, os.fstat(fh.fileno()).st_size
        while left:
            n = os.sendfile(conn.fileno(), fh.fileno(), pos, min(left, chunk))
            pos += n
            left -= n
conn.close()
"""


def _serve(script: str, files: list[Path], part_max: int) -> tuple[subprocess.Popen[str], int]:
    """``script`` (one of the servers above) over ``files`` in a separate process, like the
    broker; the process and the port it listens on."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(part_max), *map(str, files)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def raw_sendfile(files: list[Path], part_max: int = PART_MAX) -> tuple[float, int]:
    """A separate process (like the broker) serving ``files`` with os.sendfile over loopback,
    in ``part_max`` chunks; read like the fetch reader reads."""
    proc, port = _serve(_SERVER, files, part_max)
    buf = bytearray(part_max)
    total = sum(f.stat().st_size for f in files)
    with connect(port) as s:
        t0 = time.perf_counter()
        got = 0
        while got < total:
            n = s.recv_into(buf)
            if n == 0:
                break
            got += n
        elapsed = time.perf_counter() - t0
    proc.wait(timeout=60)
    return elapsed, got


_RR_SERVER = """
import os, socket, struct, sys
chunk = int(sys.argv[1])
fds = [os.open(f, os.O_RDONLY) for f in sys.argv[2:]]
sizes = [os.fstat(fd).st_size for fd in fds]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
while True:
    req = conn.recv(12, socket.MSG_WAITALL)
    if len(req) < 12:
        break
    i, pos = struct.unpack(">iq", req)
    left = min(chunk, sizes[i] - pos)
    while left:
        n = os.sendfile(conn.fileno(), fds[i], pos, left)
        pos += n
        left -= n
conn.close()
"""


def raw_request_response(files: list[Path], part_max: int = PART_MAX) -> tuple[float, int]:
    """A separate process answering each request (file index, position) with one sendfile of
    up to ``part_max`` bytes; one request in flight, like the fetch reader."""
    proc, port = _serve(_RR_SERVER, files, part_max)
    buf = bytearray(part_max)
    got = 0
    with connect(port) as s:
        t0 = time.perf_counter()
        for i, f in enumerate(files):
            size = f.stat().st_size
            pos = 0
            while pos < size:
                n = min(part_max, size - pos)
                s.sendall(struct.pack(">iq", i, pos))
                _recv_into(s, memoryview(buf)[:n])
                pos += n
                got += n
        elapsed = time.perf_counter() - t0
    proc.wait(timeout=60)
    return elapsed, got


@contextlib.contextmanager
def bench_broker(topic: str) -> Iterator[BrokerProcess]:
    """A broker (2 I/O threads, 1 network thread) over a temporary log dir, with ``topic`` of
    one partition created; stopped on exit, and an unclean exit raised with the tail of its log
    (unless the body raised first)."""
    with tempfile.TemporaryDirectory() as tmp:
        b = BrokerProcess(Path(tmp), **{"num.io.threads": "2", "num.network.threads": "1"})
        b.start()
        try:
            admin = AdminClient({"bootstrap.servers": b.bootstrap})
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)
            yield b
        finally:
            code = b.stop()
        if code != 0:
            raise RuntimeError(f"broker exited with {code}:\n{b.log_tail()}")


def confluent_read(bootstrap: str, n: int) -> float:
    c = ck.Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "bench", "fetch.max.bytes": 64 * 1024 * 1024}
    )
    c.assign([ck.TopicPartition(TOPIC, 0, 0)])
    got = 0
    t0 = time.perf_counter()
    while got < n:
        got += len(c.consume(10000, timeout=1.0))
    elapsed = time.perf_counter() - t0
    c.close()
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--partition-max-mb", type=int, default=PART_MAX >> 20)
    args = ap.parse_args()
    n = args.mb * 1024
    part_max = args.partition_max_mb << 20
    with bench_broker(TOPIC) as b:
        p = ck.Producer(
            {
                "bootstrap.servers": b.bootstrap,
                "compression.type": "lz4",
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "queue.buffering.max.kbytes": 1_000_000,
            }
        )
        values = [os.urandom(512) + b"v" * 512 for _ in range(256)]
        for i in range(n):
            while True:
                try:
                    p.produce(TOPIC, value=values[i % 256], partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(300) == 0
        files = sorted((b.log_dir / f"{TOPIC}-0").glob("*.log"))
        on_disk = sum(f.stat().st_size for f in files)
        # interleaved, best of PASSES each: the machine is shared, noise hits both sides
        broker_runs, raw_runs, rr_runs = [], [], []
        for _ in range(PASSES):
            secs, got, _ = fetch_pass(b.port, TOPIC, n, part_max)
            if got != on_disk:
                raise RuntimeError(f"fetched {got} record bytes, the log holds {on_disk}")
            broker_runs.append(secs)
            secs, got = raw_sendfile(files, part_max)
            if got != on_disk:
                raise RuntimeError(f"raw reader got {got} bytes of {on_disk}")
            raw_runs.append(secs)
            secs, got = raw_request_response(files, part_max)
            if got != on_disk:
                raise RuntimeError(f"request/response reader got {got} bytes of {on_disk}")
            rr_runs.append(secs)
        best_broker = min(broker_runs)
        raw_s = min(raw_runs)
        rr_s = min(rr_runs)
        ck_s = confluent_read(b.bootstrap, n)
    broker_mb = on_disk / best_broker / 1e6
    raw_mb = on_disk / raw_s / 1e6
    rr_mb = on_disk / rr_s / 1e6
    result = {
        "segment_bytes": on_disk,
        "records": n,
        "broker_fetch_mb_per_s": round(broker_mb, 1),
        "raw_sendfile_mb_per_s": round(raw_mb, 1),
        "raw_request_response_mb_per_s": round(rr_mb, 1),
        "broker_vs_request_response": round(broker_mb / rr_mb, 3),
        "ratio_vs_raw_sendfile": round(broker_mb / raw_mb, 3),
        "confluent_consumer_records_per_s": round(n / ck_s),
        "confluent_consumer_mb_per_s": round(on_disk / ck_s / 1e6, 1),
        "target_ratio": 0.7,
        "partition_max_bytes": part_max,
        "passes": PASSES,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    print(
        f"broker fetch {broker_mb:,.0f} MB/s, raw sendfile {raw_mb:,.0f} MB/s "
        f"(ratio {broker_mb / raw_mb:.2f}), request/response floor {rr_mb:,.0f} MB/s; "
        f"confluent consumer {n / ck_s:,.0f} records/s"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
