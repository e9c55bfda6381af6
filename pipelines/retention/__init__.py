"""Log retention as a Spark job: Kafka's rules over every partition, never ahead of the lake.

``scan`` reads what retention needs of a partition directory (sizes, time index tails),
``plan`` decides per partition with the broker's own rules
(:mod:`logstore.storage.retention`) and the lake bound, ``job`` runs it all and applies the
result through DeleteRecords (or offline under the log dir's lock), ``model`` is an
independent plain-Python reference of Kafka's rules for the tests.
"""
