"""The schema registry's errors: Confluent's HTTP status and error code on each.

Confluent's clients read ``{"error_code": int, "message": str}`` and branch on the code
(``40401`` subject not found, ``40403`` schema not found, ``409`` incompatible, ``42201``
invalid schema...), so every failure the registry answers carries both.
"""

from __future__ import annotations

from logstore.errors import LoglakeError

__all__ = [
    "IncompatibleSchemaError",
    "InvalidSchemaError",
    "RegistryError",
    "SchemaNotFoundError",
    "SubjectNotFoundError",
    "VersionNotFoundError",
]


class RegistryError(LoglakeError):
    """A request the registry refuses: ``status`` (HTTP) and ``error_code`` (Confluent's)."""

    def __init__(self, message: str, *, status: int, error_code: int) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class SubjectNotFoundError(RegistryError):
    def __init__(self, subject: str) -> None:
        super().__init__(f"Subject '{subject}' not found.", status=404, error_code=40401)


class VersionNotFoundError(RegistryError):
    def __init__(self, subject: str, version: object) -> None:
        super().__init__(
            f"Version {version} not found for subject '{subject}'.", status=404, error_code=40402
        )


class SchemaNotFoundError(RegistryError):
    def __init__(self, what: str = "Schema not found") -> None:
        super().__init__(what, status=404, error_code=40403)


class InvalidSchemaError(RegistryError):
    def __init__(self, message: str) -> None:
        super().__init__(f"Invalid schema: {message}", status=422, error_code=42201)


class IncompatibleSchemaError(RegistryError):
    def __init__(self, messages: list[str]) -> None:
        super().__init__(
            "Schema being registered is incompatible with an earlier schema: "
            + "; ".join(messages),
            status=409,
            error_code=409,
        )
        self.messages = messages
