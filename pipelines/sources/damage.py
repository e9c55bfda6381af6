"""Driver side of damage: the runs of unreadable bytes the readers found, as skipped offsets.

Each range's :class:`~pipelines.sources.read.RangeReport` lists its damage as *runs* between
sound batches (``regions``), with the end of the sound batch before the run (``from_offset``)
and the base offset of the sound batch after it (``to_offset``) when the range itself holds
them. A run can start or end at a range boundary (ranges are cut at ``.index`` entries, and a
cut may fall on a damaged batch): :func:`stitch_regions` joins the reports of a partition in
file order and fills in the missing ends from the neighbouring ranges.
:func:`skipped_offsets` then decides what a run means for one ingest run:

- a run whose offsets all lie below the partition's progress was reported by an earlier run
  (it is left out, so a re-run neither counts nor quarantines it again);
- a run that starts at or beyond the high watermark is not this run's business yet;
- a run at the end of the log (no sound batch after it) reaches the high watermark: the
  offsets below it that could not be read are skipped, not silently left out;
- a *soft* run (zero fill after the last batch, a frame cut by the end of the active segment:
  normally a batch still being written) counts only if it hides offsets below the high
  watermark.

Pure Python over the JSON reports: nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Skipped", "skipped_offsets", "stitch_regions"]

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Skipped:
    """One unreadable run of a partition: ``bytes`` bytes from ``position`` of ``file`` (a
    run reaching the end of a segment goes on in the next one's bytes), holding offsets
    ``[from_offset, to_offset)`` (None: up to an unknown log end) that the lake will not
    have; ``batches`` quarantine rows describe it, the first saying ``error``."""

    topic: str
    partition: int
    file: str
    position: int
    bytes: int
    from_offset: int
    to_offset: int | None
    batches: int
    error: str

    @property
    def offsets(self) -> int:
        return 0 if self.to_offset is None else self.to_offset - self.from_offset


def stitch_regions(
    reports: Iterable[Mapping[str, Any]],
) -> dict[TopicPartition, list[dict[str, Any]]]:
    """Every partition's damage runs in file order, joined across ranges (see module doc).

    A run still lacks ``from_offset`` when no sound batch precedes it in the partition's
    reports (its segment's base offset is used then) and ``to_offset`` when none follows.
    """
    by_tp: dict[TopicPartition, list[Mapping[str, Any]]] = {}
    for r in reports:
        if r.get("file") is not None:
            by_tp.setdefault((r["topic"], r["partition"]), []).append(r)
    out: dict[TopicPartition, list[dict[str, Any]]] = {}
    for tp, reps in by_tp.items():
        reps.sort(key=lambda r: (r["segment_base_offset"], r["start"]))
        runs: list[dict[str, Any]] = []
        carry: dict[str, Any] | None = None  # a run reaching the end of the previous range
        last_end: int | None = None
        for rep in reps:
            regions = [dict(g, rows=list(g["rows"])) for g in rep["regions"]]
            continues = bool(regions) and regions[0]["from_offset"] is None
            if carry is not None and not continues and rep["first_sound"] is not None:
                carry["to_offset"] = rep["first_sound"]
                runs.append(carry)
                carry = None
            for region in regions:
                run = region
                if run["from_offset"] is None and carry is not None:
                    # the same run goes on at the start of this range
                    carry["bytes"] += run["bytes"]
                    carry["soft"] = carry["soft"] and run["soft"]
                    carry["rows"].extend(run["rows"])
                    carry["to_offset"] = run["to_offset"]
                    run, carry = carry, None
                elif run["from_offset"] is None:
                    run["from_offset"] = last_end
                if run["to_offset"] is None:
                    carry = run
                else:
                    runs.append(run)
            if rep["last_end"] is not None:
                last_end = rep["last_end"]
        if carry is not None:
            runs.append(carry)
        for run in runs:
            if run["from_offset"] is None:
                run["from_offset"] = run["segment_base_offset"]
        out[tp] = runs
    return out


def skipped_offsets(
    reports: Iterable[Mapping[str, Any]],
    starts: Mapping[TopicPartition, int],
    high_watermarks: Mapping[TopicPartition, int] | None,
) -> tuple[list[Skipped], list[dict[str, Any]], dict[TopicPartition, int]]:
    """``(skipped runs, their quarantine rows, progress past them)`` for one ingest run.

    ``starts``: each partition's progress (the next offset to ingest); the progress past a
    run is its ``to_offset`` capped at the high watermark — a run whose end is unknown (no
    high watermark, nothing sound after it) does not move progress.
    """
    skipped: list[Skipped] = []
    rows: list[dict[str, Any]] = []
    ends: dict[TopicPartition, int] = {}
    for tp, runs in sorted(stitch_regions(reports).items()):
        start = starts.get(tp)
        if start is None:
            continue
        hw = high_watermarks.get(tp) if high_watermarks is not None else None
        for run in runs:
            low = max(int(run["from_offset"]), start)
            high = run["to_offset"] if run["to_offset"] is not None else hw
            if hw is not None:
                if run["from_offset"] >= hw:
                    continue  # beyond the high watermark: a later run's
                high = hw if high is None else min(high, hw)
            if high is not None and high <= start:
                continue  # below progress: an earlier run skipped (and quarantined) it
            if run["soft"] and (high is None or high <= low):
                continue  # zero fill or a batch in flight, hiding no committed offset
            skipped.append(
                Skipped(
                    topic=tp[0],
                    partition=tp[1],
                    file=run["file"],
                    position=run["position"],
                    bytes=run["bytes"],
                    from_offset=low,
                    to_offset=None if high is None else max(high, low),
                    batches=len(run["rows"]),
                    error=str(run["rows"][0]["error"]) if run["rows"] else "",
                )
            )
            rows.extend(run["rows"])
            if high is not None:
                ends[tp] = max(ends.get(tp, high), high)
    return skipped, rows, ends
