"""A role's parallel layout, in one place: how the ranks of its pool split into
data-parallel (dp), sequence-parallel (sp) and tensor-parallel (tp) groups, and the
checks every consumer used to repeat.

`RoleLayout(world, tp, sp, role)` is derived once from the placement
(`plan/placement.Placement.layout(role)`), checked when built, and carried to what
reads it: the worker context and its mesh (`core/context.py`), dispatch slots
(`graph/dispatch.py`), balance, the memory model, the planner's cost, the stream client,
the trainer. Ranks are ordered as the mesh `("dp", "sp", "tp")` is, tp innermost:
rank r = (dp_rank * sp + sp_rank) * tp + tp_rank, so a tp group is tp consecutive ranks
and the ranks that work on one dp slot's rows together (a "row group": sp x tp ranks)
are consecutive too. Adding a dimension is this object, its plan and its checks.

The torch DeviceMesh of a tensor-parallel role (`core/context.WorkerContext.device_mesh`)
is 2-D, `mesh_shape` = (dp x sp, tp) named (`replica_dim`, "tp"): dp and sp flattened
into one outer dim ("dp", or "dp_sp" at sp > 1) in the same rank order, because the
parameters replicate over both, so the data-parallel wrap (FSDP2) shards and reduces
gradients over it; the sp groups (`sp_groups`) are its columns within one dp slot.

Sequence parallelism (`placement.parallel.<role>.sp`, workers/parallel/sequence_parallel.py):
the sp ranks of a row group receive the same rows and split each row's positions; the
model's parameters replicate over them, so gradients reduce over dp x sp (`sp_groups`:
the ranks that split one row). Generation never runs sequence-parallel: a generating
call's layout is the role's without sp (`without_sp`). `check_sp` refuses a size below 1.

The checks that concern a layout alone live here, each raising ValueError naming the
role, the key and the numbers: tp (x sp) divides the pool (`__post_init__`), tp divides
the model's heads (`check_heads`), a training strategy or engine declares tensor
parallelism (`refuse_not_tensor_parallel`). State: none (frozen values).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["RoleLayout", "Coords", "check_sp", "refuse_not_tensor_parallel"]

MESH_DIMS = ("dp", "sp", "tp")  # outermost first; tp innermost (consecutive ranks)


class Coords(NamedTuple):
    """A rank's place in its role's layout."""
    dp: int
    sp: int
    tp: int


def check_sp(role: str, sp: int) -> None:
    """A sequence-parallel size is a whole number of at least 1."""
    if not isinstance(sp, int) or isinstance(sp, bool) or sp < 1:
        raise ValueError(
            f"placement.parallel.{role}.sp={sp!r}: the sequence-parallel size is a whole "
            f"number of at least 1 (1: each rank holds whole rows)")


@dataclass(frozen=True)
class RoleLayout:
    """The layout of one role's ranks: `world` ranks = dp x sp x tp.

    `world_size`, `tp_size` and `dp_size` are the names dispatch modes have always read
    (`graph/dispatch.Layout` is this class), kept so a registered mode keeps working.
    """
    world: int
    tp: int = 1
    sp: int = 1
    role: str = field(default="<role>", compare=False)  # for messages: two layouts of
    pool: str | None = field(default=None, compare=False)  # one shape are equal

    def __post_init__(self):
        where = f"placement.parallel.{self.role}"
        if self.world < 1:
            raise ValueError(f"role '{self.role}': its pool{self._pool()} has {self.world} "
                             "ranks; give the pool at least one device")
        if self.tp < 1:
            raise ValueError(f"{where}.tp={self.tp}: the tensor-parallel size is at least 1")
        check_sp(self.role, self.sp)
        if self.world % (self.tp * self.sp):
            allowed = [d for d in range(1, self.world + 1) if self.world % d == 0]
            if self.sp > 1:
                raise ValueError(
                    f"{where}.sp={self.sp}: role '{self.role}' has sp x tp = "
                    f"{self.sp * self.tp} ranks per row group, which does not divide the "
                    f"{self.world} device(s) of its pool{self._pool()}; sp x tp sizes this "
                    f"pool allows: {allowed}")
            raise ValueError(
                f"{where}.tp={self.tp}: role '{self.role}' has tensor-parallel size "
                f"{self.tp}, which does not divide the {self.world} device(s) of its "
                f"pool{self._pool()} (a role runs whole groups of tp ranks); "
                f"tensor-parallel sizes this pool allows: {allowed}")

    def _pool(self) -> str:
        return f" '{self.pool}'" if self.pool else ""

    # ------------------------------------------------------------------ sizes
    @property
    def dp(self) -> int:
        """Data-parallel groups: the ways a dp call's rows split."""
        return self.world // (self.tp * self.sp)

    @property
    def world_size(self) -> int:
        return self.world

    @property
    def tp_size(self) -> int:
        return self.tp

    @property
    def dp_size(self) -> int:
        return self.dp

    @property
    def row_group_size(self) -> int:
        """Ranks that work on one dp slot's rows together (sp x tp)."""
        return self.sp * self.tp

    @property
    def sharded(self) -> bool:
        """Whether a rank holds part of a model rather than all of it (tp or sp > 1)."""
        return self.row_group_size > 1

    def describe(self) -> str:
        """'dp 2 × tp 2' (dimensions of size 1 beyond dp left out)."""
        parts = [f"dp {self.dp}"] + [f"{name} {size}" for name, size in
                                     (("sp", self.sp), ("tp", self.tp)) if size > 1]
        return " × ".join(parts)

    # ------------------------------------------------------------------ ranks
    def coords(self, rank: int) -> Coords:
        rank = self._rank(rank)
        return Coords(rank // self.row_group_size, (rank // self.tp) % self.sp,
                      rank % self.tp)

    def dp_rank(self, rank: int) -> int:
        return self.coords(rank).dp

    def tp_rank(self, rank: int) -> int:
        return self.coords(rank).tp

    def row_group(self, dp_rank: int) -> tuple[int, ...]:
        """The ranks that receive dp slot `dp_rank`'s rows, first one first."""
        size = self.row_group_size
        return tuple(range(dp_rank * size, (dp_rank + 1) * size))

    def leader(self, rank: int) -> int:
        """The first rank of `rank`'s row group: where a group's one result is read."""
        return self.row_group(self.dp_rank(rank))[0]

    @property
    def tp_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each tp group (one model shard set each), in rank order."""
        return tuple(tuple(range(g * self.tp, (g + 1) * self.tp))
                     for g in range(self.world // self.tp))

    @property
    def sp_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks that split one row's positions (same dp and tp coordinates)."""
        return tuple(tuple((d * self.sp + j) * self.tp + t for j in range(self.sp))
                     for d in range(self.dp) for t in range(self.tp))

    def without_sp(self) -> "RoleLayout":
        """This layout for generation, which never splits rows: sp ranks become dp."""
        return RoleLayout(self.world, self.tp, 1, self.role, self.pool) if self.sp > 1 \
            else self

    @property
    def replica_dim(self) -> str:
        """The name of the mesh dim the parameters replicate over (gradients reduce over):
        dp, flattened with sp ("dp_sp") where the role is sequence-parallel."""
        return "dp_sp" if self.sp > 1 else "dp"

    @property
    def mesh_shape(self) -> tuple[int, int]:
        """(dp x sp, tp): the role's DeviceMesh, its dims (`replica_dim`, "tp")."""
        return (self.dp * self.sp, self.tp)

    @property
    def dp_groups(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each dp group (the same shard on every dp slot: gradients
        reduce over it), one per (sp, tp) coordinate."""
        size = self.row_group_size
        return tuple(tuple(range(i, self.world, size)) for i in range(size))

    def _rank(self, rank: int) -> int:
        if not 0 <= int(rank) < self.world:
            raise ValueError(f"rank {rank} is outside role '{self.role}''s {self.world} ranks")
        return int(rank)

    # ----------------------------------------------------------------- checks
    def check_heads(self, heads: int | None, kv_heads: int | None = None) -> None:
        """Each rank holds whole attention heads: tp divides the model's heads and
        key/value heads; the message lists the sizes the model allows. (At sp > 1 the
        Ulysses exchange splits a rank's heads/tp heads again: sp x tp must divide them,
        `workers/parallel/sequence_parallel.check_model`.)"""
        kv = kv_heads or heads
        for name, count in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
            if isinstance(count, int) and count % self.tp:
                allowed = [d for d in range(1, count + 1) if heads % d == 0 and kv % d == 0]
                raise ValueError(
                    f"placement.parallel.{self.role}.tp={self.tp} does not divide the "
                    f"model's {name}={count} (role '{self.role}'): each rank holds whole "
                    f"heads; tensor-parallel sizes this model allows: {allowed}")


def refuse_not_tensor_parallel(kind: str, key: str, name: str, able, role: str = "<role>",
                               tp: int | None = None) -> None:
    """The one refusal of a training strategy or rollout engine that does not declare
    tensor parallelism (`tensor_parallel = True`) for a role at tp > 1: `kind` says
    what it is ('training strategy'), `key` where it is set ('actor.strategy'), `able`
    the registered names that do."""
    tp_text = f"={tp}" if tp is not None else " > 1"
    raise ValueError(
        f"placement.parallel.{role}.tp{tp_text}: {kind} {key}={name!r} does not shard by "
        f"tensor parallelism; use one that does "
        f"({', '.join(sorted(able)) or 'none registered'}) or tp=1")
