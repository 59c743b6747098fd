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
the tokens (`attention_mask`), heaviest first into the lightest chunk that still
has room. The samples of one prompt (`uid`) move together and stay contiguous, as
group functions (GRPO's advantages) need them. Everything downstream reads the
permuted rows, so row i of every input still means the same sample. A loss
normalised over the whole mini-batch is unchanged; one normalised per rank (a
token mean of each rank's tokens under data parallelism) and the mini-batches'
membership change with which rows land together, as in verl.

Stateless: the plan transformation and the node function.
"""
from __future__ import annotations

from dataclasses import replace

from hybridflow.plan.compiler import plan_stages
from hybridflow.core.kinds import NodeKind, Op

__all__ = ["balanced_order", "balance_tokens", "insert_token_balance", "BALANCE_NODE"]

BALANCE_NODE = "balance_tokens"


def chunk_sizes(rows: int, parts: int) -> list[int]:
    """Rows of each contiguous chunk, as dispatch cuts them (the first `rows % parts`
    chunks hold one row more)."""
    size, extra = divmod(rows, parts)
    return [size + (1 if i < extra else 0) for i in range(parts)]


def balanced_order(lengths: list[int], parts: int, groups: list | None = None) -> list[int]:
    """A permutation of rows whose contiguous chunks (`chunk_sizes`) hold near-equal
    token totals. With `groups` (a group id per row, e.g. `uid`), a group's rows move
    together and stay contiguous, as group functions need them: whole groups are
    placed, heaviest first, each into the chunk that most lacks tokens among those
    with rows left (a group may run past a chunk's end, as in any row order).
    Without, single rows are placed the same way and keep their order in a chunk."""
    units = _units(len(lengths), groups)
    sizes = chunk_sizes(len(lengths), parts)
    bins: list[list[list[int]]] = [[] for _ in range(parts)]
    rows_in, totals = [0] * parts, [0] * parts
    for unit in sorted(units, key=lambda u: (-sum(lengths[i] for i in u), u[0])):
        room = [p for p in range(parts) if rows_in[p] < sizes[p]] or list(range(parts))
        part = min(room, key=lambda p: (totals[p], p))
        bins[part].append(unit)
        rows_in[part] += len(unit)
        totals[part] += sum(lengths[i] for i in unit)
    return [row for units_of in bins for unit in sorted(units_of) for row in unit]


def _units(rows: int, groups) -> list[list[int]]:
    """Rows that move together: one per row, or one per group (first-seen order)."""
    if groups is None:
        return [[i] for i in range(rows)]
    members: dict = {}
    for i, gid in enumerate(groups):
        members.setdefault(gid, []).append(i)
    return list(members.values())


def _spread(lengths: list[int], parts: int) -> float:
    """(heaviest chunk - lightest) / mean chunk tokens of the contiguous chunks."""
    totals, start = [], 0
    for size in chunk_sizes(len(lengths), parts):
        totals.append(sum(lengths[start:start + size]))
        start += size
    mean = sum(totals) / max(1, len(totals))
    return (max(totals) - min(totals)) / mean if mean else 0.0


def balance_tokens(batch, parts: int, group_by: str | None = "uid"):
    """The batch with its rows reordered for `parts` data-parallel ranks, each group
    of `group_by` kept together (when the batch has that column); metrics: the
    spread of tokens per rank before and after (`balance/token_spread_*`)."""
    lengths = [int(n) for n in batch["attention_mask"].sum(-1).tolist()]
    groups = list(batch[group_by]) if group_by and group_by in batch else None
    order = balanced_order(lengths, parts, groups)
    before, after = _spread(lengths, parts), _spread([lengths[i] for i in order], parts)
    if after > before:  # whole groups can land worse than the order they came in
        order, after = list(range(len(lengths))), before
    out = batch.take(order)
    metrics = {"balance/token_spread_before": before, "balance/token_spread_after": after}
    out.meta = {**out.meta, "metrics": {**out.meta.get("metrics", {}), **metrics}}
    return out


def _data_parallel(plan, node) -> int:
    pool = plan.placement.pools.get(node.pool)
    return plan.placement.layout(node.role, world=pool.world_size).dp if pool else 1


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
    for generate in [n for n in plan.nodes if n.kind.generates]:
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
    return replace(plan, nodes=nodes, stages=plan_stages(nodes))


