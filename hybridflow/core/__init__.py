"""The data model and the leaves every layer stands on: `Batch`, node kinds, the run
modes (`modes.py`: async mode, runtime, each with what it can do), the columns the
engine reads on rows (`columns.py`), config constraints, deadlines on user calls, the
one `"module:Name"` resolver and the one user-file importer, prompt data, the worker
context, a role's parallel layout (`layout.py`) and the DTensor questions
(`dtensor.py`), the section reader, the `runtime` section's schema, the optional worker hooks
(`worker_hooks.py`), the metric names that are protocol (`metric_names.py`) and the
atomic file write.

Imports nothing of hybridflow outside `core/`.
"""
