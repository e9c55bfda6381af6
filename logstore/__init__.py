"""logstore: the Kafka-compatible storage path and broker of loglake.

``logstore.protocol`` is sans-IO (bytes in, values out); ``logstore.storage`` reads and writes
Kafka-format log directories; ``logstore.server`` is the broker. No Spark imports, ever.
"""

__version__ = "0.1.0"
