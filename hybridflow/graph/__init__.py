"""What graph files and worker classes declare: the graph builder (`Graph`, `node_fn`),
method dispatch and collect modes (`method`, `DP`, ...), losses (`loss_fn`), and how a
role streams (`streams.Streams`, a worker class's `STREAMS`).

May import `core/` only.
"""
from hybridflow.graph.builder import FnSpec, Graph, Node, fn_spec, node_fn

__all__ = ["FnSpec", "Graph", "Node", "fn_spec", "node_fn"]


def __getattr__(name: str):
    """Names of the module this package's path held before the folder move (with a
    warning naming the import to write); hybridflow/core/moved.py."""
    from hybridflow.core.moved import moved_name
    return moved_name(__name__, name)
