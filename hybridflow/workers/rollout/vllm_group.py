"""One vLLM engine over a tensor-parallel group of ranks, in SPMD mode: every rank of a
tp group builds `LLM(tensor_parallel_size=tp, distributed_executor_backend=
"external_launcher")` in its own worker process (the role's, so a colocated actor and
rollout share processes), and all of them are driven with the same calls.

How a role's layout maps onto vLLM 0.32 (read from `vllm/distributed/parallel_state.py`
`initialize_model_parallel` and `config/parallel.py`, and run on the CPU build):
- torch.distributed's default group is the role's pool, W ranks. vLLM joins it and
  lays it out "ExternalDP x DP x PP x TP" with DP = PP = 1: tp groups of consecutive
  ranks [g*tp, (g+1)*tp), each an independent replica (verl's "external DP"). These
  are the groups `graph/dispatch.py` sends one chunk of rows to (rank r: dp r // tp,
  tp r % tp), and the first rank of each is collected.
- A pool with no default group yet (a rollout on its own pool trains nothing) joins
  one (`ctx.init_distributed`) before the engine is built, so vLLM never owns it.
- Sampling: vLLM samples on every TP rank from the gathered logits, so every rank of
  a group gets the same seed (the run's seed + dp rank, `group_seed`), the same
  requests in the same order, and draws the same tokens.
- CPU threads: each rank is pinned to a core list of its own inside vLLM's calls
  (`core_list`; the process state swaps it with the trainer's), never two ranks of a
  group on one list: a tp group waits on its slowest rank at every all-reduce. The
  group's lists are also set as `VLLM_CPU_OMP_THREADS_BIND` ("0|1"), which vLLM's
  multiprocess executor reads; its in-process `external_launcher` path binds nothing
  itself (vLLM 0.32: only `MultiprocExecutor` builds the `OMPProcessManager`).
- Shared memory: vLLM's CPU all-reduce names its shared-memory segment after the
  port of the executor's init method, and the external launcher's is always "env://":
  every tp group on a machine would open "/-tp:0-[0-1]-cpushm" (two runs at once, or a
  run after one that was killed, fail with errno 17). The build sees a `tcp://` method
  on the pool's own MASTER_PORT instead (`shm_named_by_port`); the default group
  exists by then, so the method names the segment and nothing else. Once every rank
  has joined (the build returns after vLLM's barrier), each rank unlinks its own
  segment's name (`unlink_shm_names`), and the group's first rank the name of the
  ring buffer of vLLM's TP message queue, which it created (`unlink_broadcast_name`):
  the mappings live on, and a rank killed at the end of a run (Ray kills its workers)
  leaves nothing in /dev/shm.
- Lockstep: a call that runs vLLM's collectives (generate, a streaming step) first
  all-gathers a digest of what each rank is about to do over vLLM's TP CPU group
  (`agree`): the rows, options and weights version for `generate` (a mismatch is an
  error: a defect in dispatch), the stream's counters and version for a poll (a
  mismatch skips the steps of that poll: one rank's weight load or submit landed
  before the other's, and the next poll steps them together).

Stateless: pure functions of the spec and of vLLM's TP group.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

import torch

__all__ = ["engine_tp", "group_seed", "check_group", "core_list", "rank_cores", "bind_env", "pin",
           "agree", "digest", "shm_named_by_port", "unlink_shm_names", "unlink_broadcast_name"]


def engine_tp(spec) -> int:
    """The engine's tensor-parallel size: the spec's, else the role's (`ctx.tp`)."""
    tp = spec.tp if getattr(spec, "tp", None) is not None else getattr(spec.ctx, "tp", 1)
    return max(1, int(tp or 1))


def group_seed(ctx, tp: int) -> int:
    """vLLM's seed for this rank: the same on every rank of a tp group."""
    return int(ctx.seed) + int(ctx.rank) // tp


def _role(spec) -> str:
    return "rollout" if spec.module is None else "actor"


def check_group(spec, tp: int, allowed: set[int] | None = None) -> None:
    """ValueError, naming the role and the numbers, when a tp group cannot be built here:
    tp not dividing the ranks, the heads or the KV heads, or fewer cores than tp ranks."""
    from hybridflow.workers.rollout.vllm_checks import check_vllm_tp
    role, world = _role(spec), int(spec.ctx.world_size)
    if world % tp:
        raise ValueError(f"placement.parallel.{role}.tp={tp} does not divide the role's "
                         f"{world} rank(s): a tp group is tp ranks of the pool")
    check_vllm_tp(spec.model_cfg, tp, f"placement.parallel.{role}.tp")
    if spec.device.type == "cpu":  # the check preflight makes before launch, too
        from hybridflow.workers.rollout.engine import check_tp_cores
        check_tp_cores(f"placement.parallel.{role}.tp", tp, _allowed(allowed), "vllm")


def _allowed(allowed: set[int] | None) -> list[int]:
    if allowed is None:
        allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else \
            set(range(os.cpu_count() or 1))
    return sorted(allowed)


def core_list(world: int, local_rank: int, rank: int, tp: int,
              allowed: set[int] | None = None) -> list[int]:
    """The cores rank `rank`'s vLLM threads run on: the process's allowed cores cut in one
    slice per rank of the pool where there are enough, else one per rank of its tp group
    (ranks of different groups may then share a list; two ranks of a group never do)."""
    cores = _allowed(allowed)
    world = max(1, int(world))
    slots, slot = (world, local_rank % world) if len(cores) >= world else (tp, rank % tp)
    width = len(cores) // slots
    return cores[slot * width:(slot + 1) * width]


def bind_env(ctx, tp: int, allowed: set[int] | None = None) -> dict[str, str]:
    """`VLLM_CPU_OMP_THREADS_BIND` for this rank's group: one core list per tp rank, in
    tp rank order (a group's ranks are consecutive, on one node)."""
    first = int(ctx.rank) - int(ctx.rank) % tp
    lists = [core_list(ctx.world_size, int(ctx.local_rank) - int(ctx.rank) + member, member,
                       tp, allowed) for member in range(first, first + tp)]
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(",".join(map(str, c)) for c in lists)}


def rank_cores(ctx, tp: int, allowed: set[int] | None = None) -> list[int]:
    return core_list(ctx.world_size, int(ctx.local_rank), int(ctx.rank), tp, allowed)


def pin(cores: list[int]) -> None:
    """Pin this process (inside vLLM's process state) to `cores`, one thread each."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(max(1, len(cores)))


def digest(*parts) -> int:
    """A 63-bit digest of `parts`' reprs (the same on every rank for equal values)."""
    text = repr(parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def agree(value: int) -> list[int]:
    """All-gather `value` over vLLM's TP group (its CPU group: gloo); every rank of the
    group must call it at the same point. Returns the group's values, in tp rank order."""
    import torch.distributed as dist
    from vllm.distributed import get_tp_group
    group = get_tp_group()
    mine = torch.tensor([value], dtype=torch.int64)
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(group.world_size)]
    dist.all_gather(out, mine, group=group.cpu_group)
    return [int(t) for t in out]


@contextlib.contextmanager
def shm_named_by_port():
    """While vLLM builds: its external launcher reports `tcp://MASTER_ADDR:MASTER_PORT`
    as its init method (see the module docstring), so the CPU all-reduce's shared memory
    is named after the pool's port."""
    from vllm.v1.executor import uniproc_executor
    launcher = uniproc_executor.ExecutorWithExternalLauncher
    original = launcher._distributed_args

    def by_port(executor):
        _, rank, local_rank = original(executor)
        return (f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", rank,
                local_rank)

    launcher._distributed_args = by_port
    try:
        yield
    finally:
        launcher._distributed_args = original


def unlink_shm_names(rank: int, port: str, root: str = "/dev/shm") -> list[str]:
    """Unlink this rank's vLLM CPU all-reduce segments of the group on `port` (named
    `<port>-<group>-[<ranks>]-cpushm_<index in the group>`); returns the names."""
    import re
    pattern = re.compile(rf"^{re.escape(str(port))}-.*-\[([\d-]+)\]-cpushm_(\d+)$")
    done = []
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        match = pattern.match(name)
        ranks = [int(r) for r in match.group(1).split("-")] if match else []
        if rank in ranks and ranks.index(rank) == int(match.group(2)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(root, name))
                done.append(name)
    return done


def unlink_broadcast_name() -> str | None:
    """Unlink the name of the ring buffer this rank created for vLLM's TP message queue
    (a `psm_*` segment the readers have attached to by the end of the build); its
    finalizer then leaves the name alone. Returns the name, or None."""
    from vllm.distributed import get_tp_group
    buffer = getattr(getattr(get_tp_group(), "mq_broadcaster", None), "buffer", None)
    if buffer is None or not getattr(buffer, "is_creator", False):
        return None
    buffer.shared_memory.unlink()
    buffer.is_creator = False
    return buffer.shared_memory.name
