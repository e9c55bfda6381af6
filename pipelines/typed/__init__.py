"""Typed tables: Confluent-framed values decoded into typed columns (issue 22).

Modules import what they need from their siblings; this package imports nothing, so that the
Avro decoder (``avro*.py``) and the job's modules can grow independently.
"""
