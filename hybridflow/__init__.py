"""hybridflow: declarative dataflow graphs for RL post-training of language models."""
from hybridflow.batch import Batch
from hybridflow.dispatch import (BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO, method,
                                 register_dispatch_mode)
from hybridflow.graph import Graph, node_fn

__all__ = ["Batch", "Graph", "node_fn", "method", "register_dispatch_mode",
           "BROADCAST", "DP", "DP_TP", "ONE_PER_WORKER", "RANK_ZERO"]
__version__ = "0.1.0"
