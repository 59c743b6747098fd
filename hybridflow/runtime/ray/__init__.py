"""The Ray executor's pieces: the executor itself, placement-group pools, the Ray session,
and the remote tasks that run function nodes and gathers on workers.

Imported only where `--runtime ray` is chosen; may import `runtime/`, `plan/`, `graph/`, `core/`.
"""
