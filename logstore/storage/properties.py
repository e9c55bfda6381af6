"""Java properties text: the one parser and writer for broker and topic configs.

Parsing follows ``java.util.Properties.load(Reader)`` exactly (Java 8 documentation; its
``LineReader`` and ``loadConvert``):

- natural lines end with ``\\n``, ``\\r`` or ``\\r\\n`` (or the end of the text); white space
  is space, tab and form feed only;
- a blank natural line (white space only) and a comment line (first non-white character
  ``#`` or ``!``) are skipped — but only where a logical line would start: inside a
  continuation, ``#`` is data; a comment line never continues, whatever it ends with;
- a natural line ending in an odd number of backslashes continues on the next one: that
  backslash, the line terminator and the next line's leading white space are dropped; a
  continuation line that is empty (after its white space) ends the logical line; a final
  backslash at the end of the text is dropped;
- the key runs from the first non-white character to the first unescaped ``=``, ``:`` or white
  space; then white space is skipped, then at most one ``=`` or ``:``, then white space again;
  the rest of the line, trailing white space included, is the value (empty when nothing is left);
- escapes, in keys and values: ``\\t \\n \\r \\f``, ``\\uXXXX`` (exactly four hex digits,
  else :class:`~logstore.errors.InvalidConfigError` — Java's "Malformed \\uxxxx encoding"),
  and a backslash before any other character is dropped (``\\=`` is ``=``, ``\\b`` is ``b``);
- a key seen twice: the last value wins.

:func:`format_properties` writes what ``Properties.store`` would: ASCII only, ``\\uXXXX``
for the rest, so the parser reads back exactly the same mapping.

Pure functions, no I/O: safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final

from logstore.errors import InvalidConfigError

__all__ = ["format_properties", "parse_properties"]

_WHITE: Final = " \t\f"
_SEPARATORS: Final = "=: \t\f"
_SIMPLE_ESCAPES: Final = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _natural_lines(text: str) -> Iterator[str]:
    """The natural lines of ``text`` without their terminators (\\n, \\r or \\r\\n)."""
    start = 0
    n = len(text)
    i = 0
    while i < n:
        ch = text[i]
        if ch in "\n\r":
            yield text[start:i]
            if ch == "\r" and i + 1 < n and text[i + 1] == "\n":
                i += 1
            start = i + 1
        i += 1
    if start < n:
        yield text[start:]


def _odd_trailing_backslashes(line: str) -> bool:
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def _logical_lines(text: str) -> Iterator[str]:
    """Logical lines, leading white space removed, comments and blank lines skipped."""
    parts: list[str] = []
    for raw in _natural_lines(text):
        line = raw.lstrip(_WHITE)
        if not parts:
            if not line or line[0] in "#!":
                continue
        elif not line:
            # an empty continuation line ends the logical line
            yield "".join(parts)
            parts = []
            continue
        if _odd_trailing_backslashes(line):
            parts.append(line[:-1])
            continue
        parts.append(line)
        yield "".join(parts)
        parts = []
    if parts:
        yield "".join(parts)  # the text ended inside a continuation: its backslash is gone


def _unescape(text: str, *, source: str) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= n:  # a lone backslash at the very end: dropped, as Java does
            break
        nxt = text[i + 1]
        if nxt == "u":
            digits = text[i + 2 : i + 6]
            if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                raise InvalidConfigError(
                    f"{source}: malformed \\uxxxx escape {text[i : i + 6]!r} in {text!r}"
                )
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_SIMPLE_ESCAPES.get(nxt, nxt))
        i += 2
    joined = "".join(out)
    # Characters beyond the BMP are written as two \u escapes (a UTF-16 surrogate pair).
    return joined.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _split(line: str) -> tuple[str, str]:
    """(raw key, raw value) of a logical line, both still escaped."""
    n = len(line)
    i = 0
    while i < n:
        ch = line[i]
        if ch == "\\":
            i += 2
            continue
        if ch in _SEPARATORS:
            break
        i += 1
    key_end = min(i, n)
    while i < n and line[i] in _WHITE:
        i += 1
    if i < n and line[i] in "=:":
        i += 1
        while i < n and line[i] in _WHITE:
            i += 1
    return line[:key_end], line[i:]


def parse_properties(text: str, *, source: str = "<properties>") -> dict[str, str]:
    """``java.util.Properties.load`` of ``text`` as a dict (see the module docstring).

    :class:`~logstore.errors.InvalidConfigError` (naming ``source``) for a malformed
    ``\\uXXXX`` escape, the only input Java refuses.
    """
    out: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        out[_unescape(key, source=source)] = _unescape(value, source=source)
    return out


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
    """Java properties text for ``props`` (sorted keys, ASCII only): parses back to ``props``."""
    return "".join(
        f"{_escape(k, is_key=True)}={_escape(v, is_key=False)}\n" for k, v in sorted(props.items())
    )
