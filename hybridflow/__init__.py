"""hybridflow: declarative dataflow graphs for RL post-training of language models.

Everything a graph file or a user's worker class needs is importable from here:
`from hybridflow import Graph, node_fn, loss_fn, checked, method, DP, Batch`.
The package's folders are its layers (docs/architecture.md): core, graph, plan, program,
run, runtime, workers, agents, planner, memory, draw, commands.
"""
from hybridflow.core.batch import Batch
from hybridflow.core.constraints import (ConfigError, above, at_least, checked, in_range, one_of,
                                         probability)
from hybridflow.core.tokens import masked_mean, training_mask
from hybridflow.graph.builder import Graph, node_fn
from hybridflow.graph.dispatch import (BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO, Layout,
                                       SlotLayout, method, register_dispatch_mode)
from hybridflow.graph.loss import loss_fn, register_default_loss

__all__ = ["Batch", "Graph", "node_fn", "loss_fn", "register_default_loss", "method",
           "register_dispatch_mode", "Layout", "SlotLayout",
           "BROADCAST", "DP", "DP_TP", "ONE_PER_WORKER", "RANK_ZERO",
           "checked", "at_least", "above", "in_range", "one_of", "probability", "ConfigError",
           "masked_mean", "training_mask"]
__version__ = "0.1.0"
