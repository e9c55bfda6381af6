"""``loglake users``: SCRAM users over KIP-554, as ``kafka-configs.sh --entity-type users``.

::

    loglake users --alter --entity-name alice \\
        --add-config 'SCRAM-SHA-512=[iterations=8192,password=alice-secret]'
    loglake users --alter --entity-name alice --delete-config SCRAM-SHA-512
    loglake users --describe [--entity-name alice]

``--entity-type users`` is accepted (and is the only type), ``--user NAME`` is
``--entity-name NAME``, as in Kafka's tool. ``--add-config`` takes one or more
``<mechanism>=[iterations=<n>,password=<p>]`` (iterations default 4096, Kafka's default, and
must lie in [4096, 16384]). The salted password is computed here, as Kafka's tool and
AdminClient do: a fresh random salt per credential, ``Hi(password, salt, iterations)``; only
salt, iterations and salted password travel (AlterUserScramCredentials v0), never the
password. ``--describe`` prints Kafka's lines, ``SCRAM credential configs for user-principal
'alice' are SCRAM-SHA-512=iterations=8192``. With ``--command-config`` the tool
authenticates like any other.

Exit codes: 0 done; 1 the broker refused for a reason that may pass; 2 bad arguments, an
unknown user or mechanism, an unacceptable credential, a bad ``--command-config``, or the
broker cannot be reached or refused the login; 130 interrupted.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Final

from kio.schema.alter_user_scram_credentials.v0.request import (
    AlterUserScramCredentialsRequest,
    ScramCredentialDeletion,
    ScramCredentialUpsertion,
)
from kio.schema.describe_user_scram_credentials.v0.request import (
    DescribeUserScramCredentialsRequest,
    UserName,
)
from kio.schema.errors import ErrorCode
from kio.static.primitive import i8, i32

from logstore.errors import LoglakeError
from logstore.server.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_IDS,
    MIN_ITERATIONS,
    salted_password,
)
from logstore.tools.admin import (
    Admin,
    ToolError,
    add_bootstrap_argument,
    bootstrap_of,
    client_config_of,
    error_name,
)
from logstore.tools.configs import parse_add_config

__all__ = ["EPILOG", "ScramUpsert", "add_arguments", "parse_scram_configs", "run"]

EPILOG: Final = (
    "Exit codes: 0 success; 1 the broker refused for a reason that may pass; 2 bad arguments,"
    " an unknown user or mechanism, an unacceptable credential (UNACCEPTABLE_CREDENTIAL), a bad"
    " --command-config, or the broker cannot be reached or refused the login; 130 interrupted."
)
DEFAULT_ITERATIONS: Final = 4096  # Kafka's ScramMechanism default for kafka-configs
_IDS: Final = {name: mid for mid, name in MECHANISM_IDS.items()}
# Refusals about what the operator named: retrying the same command changes nothing.
_USAGE: Final = frozenset(
    {
        ErrorCode.resource_not_found,
        ErrorCode.unacceptable_credential,
        ErrorCode.unsupported_sasl_mechanism,
        ErrorCode.duplicate_resource,
        ErrorCode.invalid_request,
    }
)

ScramUpsert = tuple[str, int, str]  # mechanism, iterations, password


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    add_bootstrap_argument(parser)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="list users' SCRAM mechanisms")
    action.add_argument("--alter", action="store_true", help="add or delete SCRAM credentials")
    parser.add_argument(
        "--entity-type", choices=("users",), help="accepted as kafka-configs takes it"
    )
    parser.add_argument("--entity-name", metavar="USER", help="the user")
    parser.add_argument("--user", metavar="USER", help="= --entity-type users --entity-name USER")
    parser.add_argument(
        "--add-config",
        metavar="MECH=[iterations=N,password=P]",
        help="credentials to add or replace: SCRAM-SHA-256 and/or SCRAM-SHA-512 (comma-separated)",
    )
    parser.add_argument(
        "--delete-config", metavar="MECH[,MECH]", help="mechanisms whose credential to delete"
    )


def parse_scram_configs(text: str) -> list[ScramUpsert]:
    """``SCRAM-SHA-512=[iterations=8192,password=p],SCRAM-SHA-256=[password=q]`` ->
    ``[(mechanism, iterations, password), ...]``; :class:`ToolError` when malformed."""
    out: list[ScramUpsert] = []
    for mechanism, inner in parse_add_config(text).items():
        if mechanism not in _IDS:
            raise ToolError(
                f"--add-config: {mechanism!r} is not a SCRAM mechanism"
                f" ({', '.join(_IDS)}; PLAIN users live in the broker's JAAS config)"
            )
        fields: dict[str, str] = {}
        for item in inner.split(","):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in ("iterations", "password") or key.strip() in fields:
                raise ToolError(
                    f"--add-config {mechanism}: expected [iterations=<n>,password=<p>]"
                    " (iterations optional)"
                )
            fields[key.strip()] = value
        if not fields.get("password"):
            raise ToolError(f"--add-config {mechanism}: a password is required")
        raw = fields.get("iterations", str(DEFAULT_ITERATIONS)).strip()
        if not raw.isdigit() or not MIN_ITERATIONS <= int(raw) <= MAX_ITERATIONS:
            raise ToolError(
                f"--add-config {mechanism}: iterations={raw!r}: expected an integer in"
                f" [{MIN_ITERATIONS}, {MAX_ITERATIONS}]"
            )
        out.append((mechanism, int(raw), fields["password"]))
    return out


def _user(args: argparse.Namespace) -> str | None:
    if args.user and args.entity_name and args.user != args.entity_name:
        raise ToolError("--user and --entity-name name different users")
    name = args.user or args.entity_name
    if name is not None and not name:
        raise ToolError("--entity-name must not be empty")
    return None if name is None else str(name)


def _describe(admin: Admin, user: str | None) -> int:
    resp = admin.call(
        DescribeUserScramCredentialsRequest(users=None if user is None else (UserName(name=user),))
    )
    if resp.error_code != ErrorCode.none:
        raise ToolError(
            f"describe users: {error_name(resp.error_code)}: {resp.error_message or ''}",
            retriable=resp.error_code not in _USAGE,
        )
    code = 0
    for r in sorted(resp.results, key=lambda r: r.user):
        if r.error_code != ErrorCode.none:
            print(f"Error: user {r.user}: {error_name(r.error_code)}", file=sys.stderr)
            code = max(code, 2 if r.error_code in _USAGE else 1)
            continue
        creds = ", ".join(
            f"{MECHANISM_IDS.get(int(c.mechanism), c.mechanism)}=iterations={c.iterations}"
            for c in sorted(r.credential_infos, key=lambda c: int(c.mechanism))
        )
        print(f"SCRAM credential configs for user-principal '{r.user}' are {creds}")
    return code


def _alter(admin: Admin, user: str, upserts: list[ScramUpsert], deletes: list[str]) -> int:
    request = AlterUserScramCredentialsRequest(
        deletions=tuple(ScramCredentialDeletion(name=user, mechanism=i8(_IDS[m])) for m in deletes),
        upsertions=tuple(
            ScramCredentialUpsertion(
                name=user,
                mechanism=i8(_IDS[mech]),
                iterations=i32(iterations),
                salt=(salt := secrets.token_bytes(32)),
                salted_password=salted_password(mech, password, salt, iterations),
            )
            for mech, iterations, password in upserts
        ),
    )
    resp = admin.call(request)
    for r in resp.results:
        if r.error_code != ErrorCode.none:
            raise ToolError(
                f"user {r.user}: {error_name(r.error_code)}: {r.error_message or ''}".rstrip(": "),
                retriable=r.error_code not in _USAGE,
            )
    print(f"Completed updating config for user {user}.")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        user = _user(args)
        upserts: list[ScramUpsert] = []
        deletes: list[str] = []
        if args.describe and (args.add_config or args.delete_config):
            raise ToolError("--add-config and --delete-config go with --alter")
        if args.alter:
            if user is None:
                raise ToolError("--alter needs --entity-name (or --user)")
            if not args.add_config and not args.delete_config:
                raise ToolError("--alter needs --add-config and/or --delete-config")
            upserts = parse_scram_configs(args.add_config) if args.add_config else []
            deletes = [m.strip() for m in (args.delete_config or "").split(",") if m.strip()]
            for m in deletes:
                if m not in _IDS:
                    raise ToolError(f"--delete-config: {m!r} is not a SCRAM mechanism")
            both = sorted({m for m, _i, _p in upserts} & set(deletes))
            if both:
                raise ToolError(f"mechanisms both added and deleted: {', '.join(both)}")
        with Admin(
            bootstrap_of(args), client_id="loglake-users", config=client_config_of(args)
        ) as admin:
            if args.describe:
                return _describe(admin, user)
            return _alter(admin, user or "", upserts, deletes)
    except ToolError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1 if exc.retriable else 2
    except LoglakeError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
