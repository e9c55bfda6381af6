"""The one Java-properties parser against what ``java.util.Properties.load`` gives.

Each expected value below was written by hand from the Java 8 documentation of
``Properties.load(Reader)`` (natural and logical lines, comments, continuations, separators,
escapes), not by running this parser; the comment on each case says which rule decides it.
"""

from __future__ import annotations

import pytest

from logstore.errors import InvalidConfigError
from logstore.server.config import BrokerConfig, ConfigError
from logstore.server.config import parse_properties as broker_parse_properties
from logstore.storage.properties import format_properties, parse_properties
from logstore.storage.topic_config import parse_properties as topic_parse_properties

CASES: list[tuple[str, str, dict[str, str]]] = [
    # the three separators, and white space around them skipped
    (
        "separators",
        "a=1\nb:2\nc 3\nd = 4\ne\t:\t5\nf\f6\n",
        {"a": "1", "b": "2", "c": "3", "d": "4", "e": "5", "f": "6"},
    ),
    # only ONE '=' or ':' is a separator; the next one is part of the value
    ("one separator", "k = = v\nk2::v\nk3 := v\n", {"k": "= v", "k2": ":v", "k3": "= v"}),
    # white space then '=' : still one separator (white space, then at most one '=' or ':')
    ("space then equals", "key   =   value\n", {"key": "value"}),
    # trailing white space belongs to the value; leading white space of the line does not
    ("trailing space kept", "   k = v  \t\n", {"k": "v  \t"}),
    # a key with nothing after it has the empty value, with or without separator
    (
        "key only",
        "alone\nalone2   \nalone3=\nalone4 :\n",
        {"alone": "", "alone2": "", "alone3": "", "alone4": ""},
    ),
    # an empty key is allowed ("=x" starts with a separator)
    ("empty key", "=x\n", {"": "x"}),
    # comments: first non-white char # or !, anywhere a logical line starts
    (
        "comments",
        "# c\n! c\n   # indented\n\t! tab\nk=v # not a comment\n",
        {"k": "v # not a comment"},
    ),
    # a comment line does not continue, even ending in a backslash
    ("comment never continues", "# comment \\\nk=v\n", {"k": "v"}),
    # continuation: backslash, terminator and the next line's leading white space dropped
    (
        "continuation",
        "fruits apple, \\\n    banana, \\\n\t pear\n",
        {"fruits": "apple, banana, pear"},
    ),
    # no white space is inserted: "motor\" + "cycle"
    ("continuation joins", "m=motor\\\n   cycle\n", {"m": "motorcycle"}),
    # inside a continuation, '#' and '!' are data
    ("hash in continuation", "k=a\\\n  # b\n", {"k": "a# b"}),
    # an even number of trailing backslashes is no continuation: two become one
    ("even backslashes", "k=a\\\\\nnext=1\n", {"k": "a\\", "next": "1"}),
    # three: one escaped backslash plus a continuation
    ("odd backslashes", "k=a\\\\\\\n  b\n", {"k": "a\\b"}),
    # an empty continuation line ends the logical line
    ("empty continuation line", "k=a\\\n\nnext=1\n", {"k": "a", "next": "1"}),
    ("blank continuation line", "k=a\\\n   \nnext=1\n", {"k": "a", "next": "1"}),
    # the key itself can continue
    ("key continues", "ke\\\n  y=v\n", {"key": "v"}),
    # at the end of the text a continuation backslash is dropped
    ("backslash at end of text", "k=v\\", {"k": "v"}),
    # line terminators: \n, \r, \r\n; the last line needs none
    ("terminators", "a=1\rb=2\r\nc=3\n\nd=4", {"a": "1", "b": "2", "c": "3", "d": "4"}),
    ("cr continuation", "a=x\\\r\n  y\rb=2", {"a": "xy", "b": "2"}),
    # escaped separators and white space in keys
    ("escaped key chars", "a\\=b\\:c\\ d=e\n", {"a=b:c d": "e"}),
    ("escaped space value", "k=\\ lead\n", {"k": " lead"}),
    # \t \n \r \f escapes; any other escaped char is itself (no \b, no octal)
    (
        "escapes",
        "k=a\\tb\\nc\\rd\\fe\\bf\\\\g\\\"h\\'i\\#j\\!k\\0\n",
        {"k": "a\tb\nc\rd\fe" + "bf\\g\"h'i#j!k0"},
    ),
    # \uXXXX, any case of hex digits; a surrogate pair makes one character
    ("unicode", "k=caf\\u00E9 \\u2603\\ud83d\\ude00\n", {"k": "caf\u00e9 \u2603\U0001f600"}),
    # form feed and tab are white space at line start; a lone \v is not white space
    ("only space tab ff are white", "\f\t k=v\n\x0bk2=v\n", {"k": "v", "\x0bk2": "v"}),
    # the last occurrence wins
    ("last wins", "k=1\nk=2\n", {"k": "2"}),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parses_as_java_properties_load(text: str, expected: dict[str, str]) -> None:
    assert parse_properties(text) == expected
    # the topic-config reader is the same parser
    assert topic_parse_properties(text) == expected


@pytest.mark.parametrize("bad", ["k=\\u12", "k=\\u12G4", "k=\\uzzzz\n"])
def test_malformed_unicode_escape_is_refused(bad: str) -> None:
    # Java: IllegalArgumentException("Malformed \\uxxxx encoding.")
    with pytest.raises(InvalidConfigError) as exc:
        parse_properties(bad, source="x.properties")
    assert "x.properties" in str(exc.value) and "uxxxx" in str(exc.value)
    with pytest.raises(ConfigError):
        broker_parse_properties(bad, source="broker.properties")


def test_broker_config_reads_the_same_syntax(tmp_path) -> None:
    # Kafka trims config values when it parses them (ConfigDef), after Properties.load
    path = tmp_path / "b.properties"
    path.write_text(
        "# broker\nnum.partitions = 3 \\\n   \nlog.dirs \\\n  :/tmp/x\\u0079\r\n"
        "auto.create.topics.enable:false\n",
        encoding="utf-8",
    )
    c = BrokerConfig.load(path)
    assert c.get_int("num.partitions") == 3
    assert c.get_bool("auto.create.topics.enable") is False
    assert [str(d) for d in c.log_dirs] == ["/tmp/xy"]


def test_format_round_trips() -> None:
    props = {
        "a key": "x=y:z",
        "#not comment": "!v",
        "uni": "caf\u00e9 \u2603 \U0001f600",
        "lead": "  spaced  ",
        "nl": "a\nb\\c\r\t\f",
        "": "empty key",
    }
    text = format_properties(props)
    assert text.isascii()
    assert parse_properties(text) == props
