"""ssl.principal.mapping.rules with Kafka's documented examples, and RFC 2253 subjects."""

from __future__ import annotations

import pytest

from logstore.server.security.principal import (
    PrincipalError,
    map_principal,
    parse_mapping_rules,
    subject_dn,
)

# Kafka's documentation (security.html, "Customizing SSL User Name") examples.
KAFKA_RULES = (
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
    "DEFAULT"
)


@pytest.mark.parametrize(
    ("dn", "principal"),
    [
        (
            "CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown",
            "User:serviceuser",
        ),
        ("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown", "User:adminuser@admin"),
        ("cn=duke,ou=JavaSoft,o=Sun Microsystems", "User:duke"),
        ("OU=JavaSoft,O=Sun Microsystems,C=US", "User:OU=JavaSoft,O=Sun Microsystems,C=US"),
    ],
)
def test_kafka_examples(dn, principal):
    assert map_principal(dn, parse_mapping_rules(KAFKA_RULES)) == principal


def test_upper_case_and_no_rule_applies():
    rules = parse_mapping_rules("RULE:^CN=([a-z]+),O=.*$/$1/U")
    assert map_principal("CN=alice,O=x", rules) == "User:ALICE"
    with pytest.raises(PrincipalError, match=r"no ssl\.principal\.mapping\.rules rule applies"):
        map_principal("O=x,CN=alice", rules)


@pytest.mark.parametrize("text", ["RULE:(/x/", "RULE:^a$", "DEFAULT,junk", "RULE:a/b/Q"])
def test_bad_rules_are_refused(text):
    with pytest.raises(PrincipalError):
        parse_mapping_rules(text)


def test_subject_dn_is_rfc2253_most_specific_first():
    cert = {
        "subject": (
            (("countryName", "US"),),
            (("organizationName", "Acme, Inc."),),
            (("commonName", "alice"), ("userId", "7")),
        )
    }
    assert subject_dn(cert) == r"CN=alice+UID=7,O=Acme\, Inc.,C=US"
