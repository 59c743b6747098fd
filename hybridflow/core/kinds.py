"""Typed node ops and kinds, each declaring what it does to the rows it is given.

A node's *op* says how the graph made it (`g.source`, `g.call`, `g.fn`, `g.gather`);
its *kind* says what the work is (`generate`, `inference`, `train`, ...). The engine
reads rules from these declarations instead of comparing strings: a scheduler asks
`node.row_effect.keeps_partition` to know whether a consumer may take the node's
shards as they are, not whether the kind is spelled "generate".

Both are `str` enums: a member equals its value (`NodeKind.TRAIN == "train"`),
formats and serialises as it, so graph files, configs and JSON keep plain strings;
`NodeKind.of("generate")` converts a string on entry and names the allowed ones.
This module keeps no state.
"""
from __future__ import annotations

from enum import Enum

__all__ = ["RowEffect", "Op", "NodeKind", "METHOD_KINDS"]


class _Named(str, Enum):
    """A str enum that prints as its value (Python 3.10's str mixin does not)."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @classmethod
    def of(cls, value, what: str = "value"):
        """The member for `value` (a member or its string); a clear error otherwise."""
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"{what} must be one of {known}, not {value!r}") from None


class RowEffect(_Named):
    """What a node does to the rows of its input."""
    KEEPS = "keeps"        # row i of the output is row i of the input
    REPEATS = "repeats"    # each input row becomes n rows (samples of a prompt)
    CHANGES = "changes"    # a new set of rows (a data source, a filter)
    GATHERS = "gathers"    # rows collected over repeated rounds of its upstream

    @property
    def keeps_partition(self) -> bool:
        """The output's shard i holds the rows of the input's shard i, so a consumer
        may pair them with the input's other consumers shard by shard."""
        return self is RowEffect.KEEPS


class Op(_Named):
    """How the graph made a node."""
    SOURCE = "source"      # a batch from the data loader
    CALL = "call"          # a role's method on its worker group
    FN = "fn"              # a plain function over batches
    GATHER = "gather"      # rows of a node over repeated draws (dynamic sampling)
    BUFFER = "buffer"      # holds a producer's outputs across steps (async hand-off)


class NodeKind(_Named):
    """What a node's work is; a method declares generate, inference or train."""
    SOURCE = "source"
    GENERATE = "generate"
    INFERENCE = "inference"
    TRAIN = "train"
    FUNCTION = "function"
    BUFFER = "buffer"      # the async hand-off: no work, outputs held across steps
    # weights handed from a trained role to a rollout placed apart: the planner's own
    # export/load nodes (planner/pipeline.py); no graph node has this kind
    SYNC = "sync"

    @property
    def row_effect(self) -> RowEffect:
        return _ROW_EFFECTS[self]

    @property
    def trains(self) -> bool:
        """Changes weights: a role with such a node needs its ranks in sync."""
        return self is NodeKind.TRAIN

    @property
    def generates(self) -> bool:
        """Samples responses with the role's weights: the rollout's work (an engine's
        memory, a stream, the planner's generation cost)."""
        return self is NodeKind.GENERATE

    @property
    def moves_weights(self) -> bool:
        """Hands weights between roles: no forward pass, no activations."""
        return self is NodeKind.SYNC


_ROW_EFFECTS = {NodeKind.SOURCE: RowEffect.CHANGES, NodeKind.GENERATE: RowEffect.REPEATS,
                NodeKind.INFERENCE: RowEffect.KEEPS, NodeKind.TRAIN: RowEffect.KEEPS,
                NodeKind.FUNCTION: RowEffect.KEEPS, NodeKind.BUFFER: RowEffect.KEEPS,
                NodeKind.SYNC: RowEffect.KEEPS}
METHOD_KINDS = (NodeKind.GENERATE, NodeKind.INFERENCE, NodeKind.TRAIN)
