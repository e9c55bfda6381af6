"""The static API registry: one-way imports, and ApiVersions advertising exactly it."""

from __future__ import annotations

import subprocess
import sys

from logstore.server import registry
from logstore.server.apis import API_HANDLERS, API_VERSIONS_KEY
from logstore.server.handlers import api_versions


def test_handlers_do_not_import_the_broker() -> None:
    # the loop broker -> dispatch -> apis -> handlers -> broker is gone: loading every
    # handler (through the registry) loads no broker module, in a fresh interpreter
    code = (
        "import sys, logstore.server.dispatch; "
        "print(sorted(m for m in sys.modules if m == 'logstore.server.broker'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"


def test_api_versions_advertises_exactly_the_registry() -> None:
    assert set(API_HANDLERS) == set(registry.API_HANDLERS) | {API_VERSIONS_KEY}
    advertised = {
        int(k.api_key): (int(k.min_version), int(k.max_version))
        for k in api_versions.unsupported_version_response().api_keys
    }
    assert advertised == {k: (lo, hi) for k, (lo, hi, _fn) in API_HANDLERS.items()}
    # the handlers are the modules' own functions, not wrappers
    assert API_HANDLERS[API_VERSIONS_KEY][2] is api_versions.handle
