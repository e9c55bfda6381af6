"""Typed tables from a schema registry (issue 22): ``jobs/decode.py`` turns the ``records`` of
topics whose values carry Confluent's wire format (magic byte 0, a 4-byte big-endian schema
id, the payload) into ``<lake>/tables/<topic>``, one column per field of the value schema, and
what does not decode into ``<lake>/dead_letters``.

Modules: :mod:`~pipelines.typed.avro` (the Avro decoder into Arrow),
:mod:`~pipelines.typed.jsonschema` and :mod:`~pipelines.typed.protobuf` (the other two schema
types), :mod:`~pipelines.typed.registry` (the registry client), :mod:`~pipelines.typed.wire`
(the wire format, the per-schema decode of a batch), :mod:`~pipelines.typed.config`
(``[decode]``), :mod:`~pipelines.typed.job` (the job). No imports here: ``jobs/decode.py --help``
must not load Spark, Delta or the decoders.
"""
