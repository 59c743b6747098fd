"""A graph file plus configuration turned into a program: the run config, the user's
files, preparing and compiling (`assemble`), the pre-flight checks, provenance, the bridge
to the placement planner (auto placement, async planning) and reading a measured run.

May import `core/`, `graph/`, `plan/`, `workers/` and `agents/` (their config sections),
`planner/` and `memory/`; never `run/`, `runtime/`, `draw/` or `commands/`.
"""


def __getattr__(name: str):
    """Names of the module this package's path held before the folder move (with a
    warning naming the import to write); hybridflow/core/moved.py."""
    from hybridflow.core.moved import moved_name
    return moved_name(__name__, name)
