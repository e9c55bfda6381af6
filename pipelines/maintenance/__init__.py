"""Table side of retention: ``records`` retention and maintenance of every loglake table.

``tables`` holds both: :func:`~pipelines.maintenance.tables.records_retention` deletes whole
``date`` partitions of ``records`` past ``[retention] records``, and
:func:`~pipelines.maintenance.tables.maintain_table` compacts, vacuums, checkpoints and
cleans the log of one Delta table. ``jobs/maintain.py`` runs them.
"""
