"""Per-topic config overrides stored in the log directory, so the directory describes itself.

File: ``<log_dir>/topic-configs/<topic>.properties``, Java properties text (ISO-8859-1 with
``\\uXXXX`` escapes for anything else, as ``java.util.Properties.store`` writes), one
``key=value`` line per override of a Kafka topic-level config (``segment.bytes``,
``cleanup.policy``, ...). Only the overrides are stored; defaults come from the broker.

Writes are atomic (tmp, fsync, rename, directory fsync). Spark jobs read these files to know a
topic's cleanup policy and retention. Topic names are validated before they become file names,
so nothing here can write outside ``<log_dir>/topic-configs``. Thread-safe for distinct topics.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from logstore.errors import LoglakeError
from logstore.storage.files import fsync_dir, validate_topic

__all__ = [
    "TOPIC_CONFIG_DIR",
    "delete_topic_config",
    "format_properties",
    "parse_properties",
    "read_topic_config",
    "read_topic_configs",
    "topic_config_path",
    "write_topic_config",
]

TOPIC_CONFIG_DIR = "topic-configs"
_SUFFIX = ".properties"


def _escape(text: str, *, is_key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\f":
            out.append("\\f")
        elif ch in "=:#!":
            out.append("\\" + ch)
        elif ch == " " and (is_key or i == 0):
            out.append("\\ ")
        elif ord(ch) < 0x20 or ord(ch) > 0x7E:
            if ord(ch) > 0xFFFF:
                data = ch.encode("utf-16-be")
                out.append(f"\\u{data[0]:02x}{data[1]:02x}\\u{data[2]:02x}{data[3]:02x}")
            else:
                out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def format_properties(props: Mapping[str, str]) -> str:
    """Java properties text for ``props`` (sorted keys, ASCII only)."""
    return "".join(
        f"{_escape(k, is_key=True)}={_escape(v, is_key=False)}\n" for k, v in sorted(props.items())
    )


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw.lstrip(" \t\f")
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        lines.append(pending + line)
        pending = ""
    if pending:
        lines.append(pending)
    return lines


def _unescape(text: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "\\" or i + 1 >= len(text):
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            try:
                out.append(chr(int(digits, 16)))
            except ValueError:
                raise LoglakeError(f"bad \\u escape {digits!r} in properties text") from None
            i += 6
            continue
        out.append({"n": "\n", "r": "\r", "t": "\t", "f": "\f"}.get(nxt, nxt))
        i += 2
    joined = "".join(out)
    # Re-pair surrogates written as two \u escapes.
    return joined.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java properties text (comments, continuations, ``=``/``:``/space separators)."""
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        i = 0
        key_chars: list[str] = []
        while i < len(line):
            ch = line[i]
            if ch == "\\" and i + 1 < len(line):
                key_chars.append(line[i : i + 2])
                i += 2
                continue
            if ch in "=: \t\f":
                break
            key_chars.append(ch)
            i += 1
        while i < len(line) and line[i] in " \t\f":
            i += 1
        if i < len(line) and line[i] in "=:":
            i += 1
            while i < len(line) and line[i] in " \t\f":
                i += 1
        out[_unescape("".join(key_chars))] = _unescape(line[i:])
    return out


def topic_config_path(log_dir: str | os.PathLike[str], topic: str) -> Path:
    """``<log_dir>/topic-configs/<topic>.properties`` (topic validated first)."""
    return Path(log_dir) / TOPIC_CONFIG_DIR / (validate_topic(topic) + _SUFFIX)


def write_topic_config(
    log_dir: str | os.PathLike[str], topic: str, props: Mapping[str, str]
) -> None:
    """Replace ``topic``'s overrides with ``props`` atomically."""
    path = topic_config_path(log_dir, topic)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = format_properties(props).encode("ascii")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_topic_config(log_dir: str | os.PathLike[str], topic: str) -> dict[str, str]:
    """``topic``'s overrides; ``{}`` when it has none."""
    try:
        text = topic_config_path(log_dir, topic).read_bytes().decode("latin-1")
    except FileNotFoundError:
        return {}
    return parse_properties(text)


def read_topic_configs(log_dir: str | os.PathLike[str]) -> dict[str, dict[str, str]]:
    """``{topic: overrides}`` for every valid ``<topic>.properties`` file in the log dir."""
    root = Path(log_dir) / TOPIC_CONFIG_DIR
    out: dict[str, dict[str, str]] = {}
    if not root.is_dir():
        return out
    for entry in sorted(root.iterdir()):
        if not entry.name.endswith(_SUFFIX) or not entry.is_file():
            continue
        topic = entry.name[: -len(_SUFFIX)]
        try:
            validate_topic(topic)
        except LoglakeError:
            continue
        out[topic] = parse_properties(entry.read_bytes().decode("latin-1"))
    return out


def delete_topic_config(log_dir: str | os.PathLike[str], topic: str) -> None:
    """Remove ``topic``'s overrides file (no error if absent)."""
    path = topic_config_path(log_dir, topic)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)
