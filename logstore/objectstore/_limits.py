"""Caps on what loglake reads of answers that are not data (a leaf: no loglake imports, so
:mod:`~logstore.objectstore.credentials` and the S3 modules that import it share one cap)."""

from __future__ import annotations

__all__ = ["ERROR_BODY_MAX"]

# Most bytes read of an answer's body that is not data: a PUT's answer, a GET's error (S3's
# error documents are a few hundred bytes), a credentials document (IMDS, the container
# endpoint, STS, the SSO portal, a credential_process's output: under 4 KiB with a session
# token). A peer declaring or sending more is not believed.
ERROR_BODY_MAX = 64 << 10
