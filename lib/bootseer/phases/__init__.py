"""Startup phase records: one row per (job, run, node, phase), kept as Parquet in the store.

- :mod:`~bootseer.phases.schema`: the row, its Arrow schema, the standard phase names.
- :mod:`~bootseer.phases.marks`: job-side marks (``bootseer.phase(...)``, ``bootseer phase ...``).
- :mod:`~bootseer.phases.spool`: the node-local spool marks and hook rows wait in.
- :mod:`~bootseer.phases.hooks`: rows from the Prolog/Epilog (``record_hook_run``).
- :mod:`~bootseer.phases.flush`, :mod:`~bootseer.phases.writer`: spool -> Parquet files.
- :mod:`~bootseer.phases.reader`, :mod:`~bootseer.phases.compact`: reading, compaction.
- :mod:`~bootseer.phases.report`, :mod:`~bootseer.phases.render`, :mod:`~bootseer.phases.plot`:
  ``bootseer report``.

Importing this package is cheap: pyarrow loads only where rows meet Parquet.
"""

from __future__ import annotations
