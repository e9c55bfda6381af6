"""Principals: who a connection is, as Kafka names it (``User:<name>``).

- PLAINTEXT listener, or TLS without a client certificate: ``User:ANONYMOUS``.
- TLS with a client certificate (mTLS): the certificate's subject as an RFC 2253
  distinguished name (most specific RDN first, as Java's ``X500Principal.getName()`` prints
  it: ``CN=alice,O=Example``), mapped through ``ssl.principal.mapping.rules``.
- SASL: ``User:<authenticated user>``.

``ssl.principal.mapping.rules`` is Kafka's syntax (KIP-371): a comma-separated list of
``RULE:<regex>/<replacement>/[L|U]`` and ``DEFAULT``; the first rule whose regex matches the
*whole* DN gives the name (``$1``... are the regex's groups; ``L``/``U`` lower or upper the
result); ``DEFAULT`` gives the DN unchanged. A DN that no rule matches cannot be named, and
the connection is refused (Kafka fails its authentication the same way).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from logstore.errors import LoglakeError

__all__ = [
    "ANONYMOUS",
    "MappingRule",
    "PrincipalError",
    "map_principal",
    "parse_mapping_rules",
    "subject_dn",
]

ANONYMOUS: Final = "User:ANONYMOUS"
# Python's ssl names -> the short names Java prints in RFC 2253 form.
_SHORT: Final = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
_RULE: Final = re.compile(r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])+)/((?:\\.|[^\\/])*)/?([LU])?)\s*(,|$)")


class PrincipalError(LoglakeError):
    """Bad ``ssl.principal.mapping.rules``, or a DN that no rule names."""


@dataclass(frozen=True, slots=True)
class MappingRule:
    pattern: re.Pattern[str] | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""  # "", "L" or "U"


def parse_mapping_rules(
    text: str, *, key: str = "ssl.principal.mapping.rules"
) -> list[MappingRule]:
    rules: list[MappingRule] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _RULE.match(text, pos)
        if m is None:
            raise PrincipalError(
                f"{key}={text!r}: cannot parse at {text[pos : pos + 30]!r}; expected"
                " RULE:<regex>/<replacement>/[L|U] or DEFAULT, comma-separated"
            )
        if m.group(1) == "DEFAULT":
            rules.append(MappingRule(None))
        else:
            try:
                pattern = re.compile(m.group(2))
            except re.error as exc:
                raise PrincipalError(f"{key}: bad regex {m.group(2)!r}: {exc}") from None
            rules.append(MappingRule(pattern, m.group(3), m.group(4) or ""))
        pos = m.end()
    return rules or [MappingRule(None)]


def map_principal(dn: str, rules: Sequence[MappingRule]) -> str:
    """``User:<name>`` for the certificate subject ``dn``; PrincipalError if no rule applies."""
    for rule in rules:
        if rule.pattern is None:
            return f"User:{dn}"
        m = rule.pattern.fullmatch(dn)
        if m is None:
            continue
        # Java's $1 group references, turned into Python's \g<1>
        name = m.expand(re.sub(r"\$(\d+)", r"\\g<\1>", rule.replacement.replace("\\", "\\\\")))
        if rule.case == "L":
            name = name.lower()
        elif rule.case == "U":
            name = name.upper()
        return f"User:{name}"
    raise PrincipalError(f"no ssl.principal.mapping.rules rule applies to {dn!r}")


def _escape(value: str) -> str:
    out = re.sub(r'([,+"\\<>;=])', r"\\\1", value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def subject_dn(cert: dict[str, Any]) -> str:
    """RFC 2253 subject of a certificate from :meth:`ssl.SSLSocket.getpeercert`."""
    rdns = []
    for rdn in reversed(cert.get("subject", ())):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)
