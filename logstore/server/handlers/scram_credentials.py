"""DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51), v0 (KIP-554).

Alter: each upsertion gives user, mechanism (1 SCRAM-SHA-256, 2 SCRAM-SHA-512), iterations,
salt and salted password; the broker keeps only the derived keys
(:mod:`logstore.server.security.scram`). Per user, as Kafka answers: an unknown mechanism is
UNSUPPORTED_SASL_MECHANISM, iterations outside [4096, 16384] or an empty user or salt
UNACCEPTABLE_CREDENTIAL, a user named twice for one mechanism in one request
DUPLICATE_RESOURCE, deleting a credential that does not exist RESOURCE_NOT_FOUND. The valid
changes are written together and answered once durable; a disk that refuses fails every
change of the request (UNKNOWN_SERVER_ERROR) and changes nothing.

Describe: the named users (null: all) with their mechanisms and iterations, never salts or
keys; a user without credentials is RESOURCE_NOT_FOUND, a user named twice
DUPLICATE_RESOURCE.

Authorization (with ``authorizer.class.name``): Describe needs DESCRIBE on the cluster, Alter
ALTER on it (``CLUSTER_AUTHORIZATION_FAILED``: the whole Describe, every user of an Alter), as
Kafka.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from kio.schema.errors import ErrorCode

from logstore.server.context import RequestContext
from logstore.server.handlers._util import ZERO_MS, build, response_module
from logstore.server.security.acls import AclOperation
from logstore.server.security.authorizer import authorized_cluster
from logstore.server.security.scram import (
    MAX_ITERATIONS,
    MECHANISM_IDS,
    MIN_ITERATIONS,
    credential_from_salted,
)

__all__ = ["API_HANDLERS"]

log = logging.getLogger(__name__)

DESCRIBE_KEY: Final = 50
ALTER_KEY: Final = 51
_IDS: Final = {name: i for i, name in MECHANISM_IDS.items()}


def handle_describe(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    if not authorized_cluster(ctx, AclOperation.DESCRIBE):
        # Kafka: DESCRIBE on the cluster, else the whole request fails
        return build(
            mod.DescribeUserScramCredentialsResponse,
            throttle_time=ZERO_MS,
            error_code=ErrorCode.cluster_authorization_failed,
            error_message=None,
            results=(),
        )
    store = ctx.broker.scram_credentials
    names = None if request.users is None else [str(u.name) for u in request.users]
    found = store.describe(None if names is None else set(names))
    results = []
    for user in sorted(found) if names is None else names:
        if names is not None and names.count(user) > 1:
            error, message, infos = ErrorCode.duplicate_resource, "user named twice", ()
        elif user not in found:
            error, message, infos = (
                ErrorCode.resource_not_found,
                f"Attempt to describe nonexistent user {user!r}",
                (),
            )
        else:
            error, message = ErrorCode.none, None
            infos = tuple(
                build(mod.CredentialInfo, mechanism=_IDS[m], iterations=i)
                for m, i in sorted(found[user].items())
            )
        results.append(
            build(
                mod.DescribeUserScramCredentialsResult,
                user=user,
                error_code=error,
                error_message=message,
                credential_infos=infos,
            )
        )
    unique = {(r.user, r.error_code) for r in results}
    return build(
        mod.DescribeUserScramCredentialsResponse,
        throttle_time=ZERO_MS,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(r for r in results if (r.user, r.error_code) in unique),
    )


def handle_alter(ctx: RequestContext, request: Any) -> Any:
    mod = response_module(ctx)
    store = ctx.broker.scram_credentials
    errors: dict[str, tuple[ErrorCode, str]] = {}
    if not authorized_cluster(ctx, AclOperation.ALTER):
        # Kafka: ALTER on the cluster, else every user of the request is refused
        for item in (*request.deletions, *request.upsertions):
            errors[str(item.name)] = (ErrorCode.cluster_authorization_failed, "")
        return _alter_response(mod, request, errors)
    seen: dict[tuple[str, int], int] = {}
    for item in (*request.deletions, *request.upsertions):
        key = (str(item.name), int(item.mechanism))
        seen[key] = seen.get(key, 0) + 1
    upserts = []
    deletes = []
    for item in request.deletions:
        user, mech_id = str(item.name), int(item.mechanism)
        mech = MECHANISM_IDS.get(mech_id)
        if seen[(user, mech_id)] > 1:
            errors[user] = (ErrorCode.duplicate_resource, "user and mechanism named twice")
        elif mech is None:
            errors[user] = (ErrorCode.unsupported_sasl_mechanism, f"mechanism {mech_id}")
        elif store.get(user, mech) is None:
            errors[user] = (
                ErrorCode.resource_not_found,
                f"Attempt to delete a user credential that does not exist: {user} {mech}",
            )
        else:
            deletes.append((user, mech))
    for item in request.upsertions:
        user, mech_id = str(item.name), int(item.mechanism)
        mech = MECHANISM_IDS.get(mech_id)
        iterations = int(item.iterations)
        if seen[(user, mech_id)] > 1:
            errors[user] = (ErrorCode.duplicate_resource, "user and mechanism named twice")
        elif mech is None:
            errors[user] = (ErrorCode.unsupported_sasl_mechanism, f"mechanism {mech_id}")
        elif not user or not item.salt or not item.salted_password:
            errors[user] = (ErrorCode.unacceptable_credential, "empty user, salt or password")
        elif not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            errors[user] = (
                ErrorCode.unacceptable_credential,
                f"iterations {iterations} outside [{MIN_ITERATIONS}, {MAX_ITERATIONS}]",
            )
        else:
            cred = credential_from_salted(
                mech, bytes(item.salted_password), bytes(item.salt), iterations
            )
            upserts.append((user, mech, cred))
    # A user with any refused change gets none applied (Kafka answers per user).
    upserts = [u for u in upserts if u[0] not in errors]
    deletes = [d for d in deletes if d[0] not in errors]
    if upserts or deletes:
        try:
            store.alter(upserts=upserts, deletes=deletes)
        except OSError as exc:
            log.error("cannot write SCRAM credentials %s: %s", store.path, exc)
            for failed in {u[0] for u in upserts} | {d[0] for d in deletes}:
                errors[failed] = (ErrorCode.unknown_server_error, "credentials not written")
    return _alter_response(mod, request, errors)


def _alter_response(mod: Any, request: Any, errors: dict[str, tuple[ErrorCode, str]]) -> Any:
    order = [str(i.name) for i in (*request.deletions, *request.upsertions)]
    results = []
    for user in dict.fromkeys(order):
        error, message = errors.get(user, (ErrorCode.none, ""))
        results.append(
            build(
                mod.AlterUserScramCredentialsResult,
                user=user,
                error_code=error,
                error_message=message or None,
            )
        )
    return build(
        mod.AlterUserScramCredentialsResponse, throttle_time=ZERO_MS, results=tuple(results)
    )


API_HANDLERS: Final = {
    DESCRIBE_KEY: (0, 0, handle_describe),
    ALTER_KEY: (0, 0, handle_alter),
}
