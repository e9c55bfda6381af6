"""pipelines: the PySpark library of loglake (sources, decoding, lookups, Delta sink).

Importing it points numba's on-disk cache at a directory named by a digest of the kernel
modules' sources (:mod:`pipelines.numba_cache`), before any kernel module is imported: a
changed callee never reaches a caller through stale machine code.
"""

from pipelines import numba_cache as _numba_cache

_numba_cache.configure()
