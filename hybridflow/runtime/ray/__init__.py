"""The Ray executor's pieces: the executor itself, placement-group pools, the Ray session,
and the remote tasks that run function nodes and gathers on workers.

Imported only where `--runtime ray` is chosen; may import `runtime/`, `plan/`, `graph/`, `core/`.
"""


def __getattr__(name: str):
    """Names of the module this package's path held before the folder move (with a
    warning naming the import to write); hybridflow/core/moved.py."""
    from hybridflow.core.moved import moved_name
    return moved_name(__name__, name)
