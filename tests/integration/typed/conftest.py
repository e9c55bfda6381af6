"""The typed-table tests' fixtures (the in-process registry)."""

from tests.fixtures.typed import registry_url

__all__ = ["registry_url"]
