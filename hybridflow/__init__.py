"""hybridflow: declarative dataflow graphs for RL post-training of language models.

The public surface: everything a graph file, a worker class, a loss, a scorer or an
environment needs imports from here (`from hybridflow import Graph, node_fn, loss_fn,
checked, method, DP, Batch, ...`), plus the documented public modules
`hybridflow.agents` (environments and tools), `hybridflow.planner` (the placement
planner), and the shipped library: `hybridflow.graphs` (the graph files and the ops they
share, e.g. `from hybridflow.graphs import ops`) and `hybridflow.algorithms` (the RL math,
e.g. `from hybridflow.algorithms import losses`), the repository's graphs/ and
algorithms/ installed under this package's name (hybridflow/core/shipped.py).
docs/functions.md lists the names; tests/core/test_public_surface.py holds the list.
The package's folders are its layers (docs/architecture.md): core, graph, plan, program,
run, runtime, workers, agents, planner, memory, draw, commands; they may move, these
names do not. A module path from before the folder move (`hybridflow.constraints`,
`hybridflow.loss`, ...) still imports, with a warning naming the import to write
(hybridflow/core/moved.py).
"""
import importlib as _importlib

from hybridflow.core.batch import Batch
from hybridflow.core.constraints import (ConfigError, above, at_least, checked, in_range, one_of,
                                         probability)
from hybridflow.core.moved import install as _install_moved
from hybridflow.core.shipped import install as _install_shipped
from hybridflow.core.printable import printable
from hybridflow.core.tokens import masked_mean, training_mask
from hybridflow.graph.builder import Graph, node_fn
from hybridflow.graph.dispatch import (BROADCAST, DP, DP_TP, ONE_PER_WORKER, RANK_ZERO, Layout,
                                       SlotLayout, method, register_dispatch_mode)
from hybridflow.graph.loss import loss_fn, register_default_loss

# public names whose modules are heavy (transformers, torch workers) or sit in layers
# above this file's imports: loaded on first use (PEP 562)
_LAZY = {
    "load_batch": "hybridflow.run.batch_dump",
    "register_engine": "hybridflow.workers.rollout",
    "declare_engine_memory": "hybridflow.workers.rollout",
    "EngineMemory": "hybridflow.workers.rollout",
    "register_setting_names": "hybridflow.workers.config",
    "load_tokenizer": "hybridflow.workers.tokenizer",
    "tokenizer_spec": "hybridflow.workers.tokenizer",
    "read_rows": "hybridflow.core.data",
    "write_rows": "hybridflow.core.data",
    "SHAPED_REWARD_MEAN": "hybridflow.core.metric_names",
    "ZERO_STD_GROUPS": "hybridflow.core.metric_names",
}

__all__ = ["Batch", "Graph", "node_fn", "loss_fn", "register_default_loss", "method",
           "register_dispatch_mode", "Layout", "SlotLayout",
           "BROADCAST", "DP", "DP_TP", "ONE_PER_WORKER", "RANK_ZERO",
           "checked", "at_least", "above", "in_range", "one_of", "probability", "ConfigError",
           "masked_mean", "training_mask", "printable", *_LAZY]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hybridflow' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


_install_moved()
_install_shipped()
