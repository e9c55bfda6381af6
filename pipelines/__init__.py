"""pipelines: the PySpark library of loglake (sources, decoding, lookups, Delta sink)."""
