"""`trainer.balance_batch`: the rows of each generated batch are reordered so that
every data-parallel rank of the passes that read them receives about as many tokens,
not only as many rows (verl's `balance_batch`).

Dispatch cuts a batch into contiguous chunks of near-equal row counts (`SlotLayout`,
as `Batch.split` cuts): with ragged responses one rank can get most of the long
ones and the others wait for it. With the switch on, `prepare` inserts one function
node after each generate node,

    rollout.generate -> balance_tokens (parts = the consumers' data-parallel size)
                     -> every node that read the generate node

which permutes the rows so that each contiguous chunk holds a near-equal share of
the tokens (`attention_mask`), longest rows placed first into the lightest chunk
that still has room. Everything downstream reads the permuted rows, so row i of
every input still means the same sample; groups are found by `uid`, never by
position. Losses normalised over the mini-batch are unchanged; with several
mini-batches, which rows share one differs (as in verl).

Stateless: the plan transformation and the node function.
"""
from __future__ import annotations

from dataclasses import replace

import networkx as nx

from hybridflow.kinds import NodeKind, Op

__all__ = ["balanced_order", "balance_tokens", "insert_token_balance", "BALANCE_NODE"]

BALANCE_NODE = "balance_tokens"


def chunk_sizes(rows: int, parts: int) -> list[int]:
    """Rows of each contiguous chunk, as dispatch cuts them (the first `rows % parts`
    chunks hold one row more)."""
    size, extra = divmod(rows, parts)
    return [size + (1 if i < extra else 0) for i in range(parts)]


def balanced_order(lengths: list[int], parts: int) -> list[int]:
    """A permutation of rows whose contiguous chunks (`chunk_sizes`) hold near-equal
    token totals: longest rows first, each into the lightest chunk with room; rows
    keep their relative order inside a chunk."""
    sizes = chunk_sizes(len(lengths), parts)
    bins: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for row in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        part = min((p for p in range(parts) if len(bins[p]) < sizes[p]),
                   key=lambda p: (totals[p], p))
        bins[part].append(row)
        totals[part] += lengths[row]
    return [row for rows in bins for row in sorted(rows)]


def _spread(lengths: list[int], parts: int) -> float:
    """(heaviest chunk - lightest) / mean chunk tokens of the contiguous chunks."""
    totals, start = [], 0
    for size in chunk_sizes(len(lengths), parts):
        totals.append(sum(lengths[start:start + size]))
        start += size
    mean = sum(totals) / max(1, len(totals))
    return (max(totals) - min(totals)) / mean if mean else 0.0


def balance_tokens(batch, parts: int):
    """The batch with its rows reordered for `parts` data-parallel ranks; metrics:
    the spread of tokens per rank before and after (`balance/token_spread_*`)."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1).tolist()]
    order = balanced_order(lengths, parts)
    out = batch.take(order)
    metrics = {"balance/token_spread_before": _spread(lengths, parts),
               "balance/token_spread_after": _spread([lengths[i] for i in order], parts)}
    out.meta = {**out.meta, "metrics": {**out.meta.get("metrics", {}), **metrics}}
    return out


def _data_parallel(plan, node) -> int:
    pool = plan.placement.pools.get(node.pool)
    return (pool.world_size // plan.placement.tp_size(node.role)) if pool else 1


def _parts(plan, generate) -> int:
    """The data-parallel size of the calls that read the generated rows (the
    largest: a training pass is the costliest reader)."""
    readers = [n for n in plan.nodes if generate.name in n.deps and n.op is Op.CALL]
    return max((_data_parallel(plan, n) for n in readers), default=1)


def _balance_node(generate, parts: int, name: str):
    keys = dict(generate.output_keys)
    return replace(generate, name=name, kind=NodeKind.FUNCTION, op=Op.FN,
                   deps=(generate.name,),
                   location=f"inserted by trainer.balance_batch after '{generate.name}'",
                   role=None, method=None, pool=None, dispatch=None,
                   reads=("attention_mask",), optional=(), writes=(), kwargs={"parts": parts},
                   fn=balance_tokens, group_by=None, rows=False, forwards=True, rename={},
                   input_keys=keys, output_keys=keys)


def insert_token_balance(plan):
    """`plan` with a balance node after each generate node read by more than one
    data-parallel rank (the same plan when there is none)."""
    nodes, taken = list(plan.nodes), {n.name for n in plan.nodes}
    for generate in [n for n in plan.nodes if n.kind is NodeKind.GENERATE]:
        parts = _parts(plan, generate)
        if parts < 2:
            continue
        name, i = BALANCE_NODE, 2
        while name in taken:
            name, i = f"{BALANCE_NODE}#{i}", i + 1
        taken.add(name)
        balance = _balance_node(generate, parts, name)
        nodes = [replace(n, deps=tuple(name if d == generate.name else d for d in n.deps))
                 if generate.name in n.deps else n for n in nodes]
        nodes.insert(nodes.index(next(n for n in nodes if n.name == generate.name)) + 1,
                     balance)
    if len(nodes) == len(plan.nodes):
        return plan
    return replace(plan, nodes=nodes, stages=_stages(nodes))


def _stages(nodes) -> list[list[str]]:
    graph = nx.DiGraph()
    graph.add_nodes_from(n.name for n in nodes)
    graph.add_edges_from((d, n.name) for n in nodes for d in n.deps)
    return [sorted(g) for g in nx.topological_generations(graph)]
