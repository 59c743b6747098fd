"""What graph files and worker classes declare: the graph builder (`Graph`, `node_fn`),
method dispatch and collect modes (`method`, `DP`, ...), and losses (`loss_fn`).

May import `core/` only.
"""
from hybridflow.graph.builder import FnSpec, Graph, Node, fn_spec, node_fn

__all__ = ["FnSpec", "Graph", "Node", "fn_spec", "node_fn"]
