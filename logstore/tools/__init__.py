"""Operator tools behind the ``loglake`` command line."""
