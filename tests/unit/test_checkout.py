"""A clone tests itself: the real Kafka fixtures are in the repository, every one listed with
its checksum in their README (the provenance), and no tracked file is large."""

from __future__ import annotations

import hashlib
import subprocess

from tests.conftest import KAFKA_REAL, ROOT

MAX_TRACKED_BYTES = 5 << 20


def test_kafka_real_fixtures_are_in_the_checkout_with_their_provenance() -> None:
    assert KAFKA_REAL.is_relative_to(ROOT)
    readme = (KAFKA_REAL / "README.md").read_text(encoding="utf-8")
    files = sorted(p for p in KAFKA_REAL.rglob("*") if p.is_file() and p.name != "README.md")
    assert len(files) == 20
    for p in files:
        rel = p.relative_to(KAFKA_REAL).as_posix()
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        assert f"{p.stat().st_size:7d}  {digest}  {rel}" in readme, rel
    tracked = subprocess.run(
        ["git", "ls-files", str(KAFKA_REAL.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert len(tracked) == len(files) + 1  # and the README


def test_no_tracked_file_is_over_5_mib() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    sizes = {name: (ROOT / name).stat().st_size for name in tracked if (ROOT / name).is_file()}
    assert len(sizes) > 100
    assert {n: s for n, s in sizes.items() if s > MAX_TRACKED_BYTES} == {}
