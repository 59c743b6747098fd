"""The training step shared by the actor and the critic, and weight files.

`Trainer.train(batch, loss_fn, ...)` runs epochs over mini-batches (one optimizer
step each) split into micro-batches (one forward/backward each, gradients
accumulated). Data parallelism: each rank holds its shard of every mini-batch;
`loss_fn` gets the *global* token and sequence counts of the mini-batch (all-reduced)
so the ranks' losses sum to the loss of the whole mini-batch; DDP averages
gradients, so each rank backpropagates `dp * loss` (`dp`: the data-parallel ranks,
the world size unless tensor-parallel; `world`: the ranks the module spans). The
result: 2 ranks make the same update as 1 rank on the same global batch. Ranks agree
on the number of mini- and micro-batches, and a rank that runs out of rows runs a
zero-loss dummy step, so the collective calls always match. Micro-batches are row slices, or with
`max_tokens` length-sorted groups within a token budget, trimmed to their longest row
(`micro_batches.py`; `packed`: the budget counts real tokens, for a `loss_fn` that
packs each micro-batch, `packing.py`); the counts are the mini-batch's either way, so
the gradient is the same.

`loss_fn(model, micro, global_tokens, global_seqs) -> (loss, contributions)`, where
`contributions` are 0-dim tensors that sum, over micro-batches and ranks, to the
mini-batch's metric value (e.g. a token-mean loss share, or a masked mean times the
micro-batch's share of the tokens). The trainer averages them over mini-batches.
The workers build `loss_fn` from the graph's loss (`hybridflow/graph/loss.py`).

Data parallelism and precision come from the backend named by `strategy`
(`hybridflow/workers/backends/`: ddp, fsdp2). Tensor parallelism (`ctx.tp > 1`, a
backend with `tensor_parallel = True`): the role's ranks form dp groups of tp ranks
(`ctx.device_mesh()`); the ranks of a tp group hold the same rows and compute one
replicated loss, so the data-parallel size is world / tp: counts and metrics are
all-reduced over the "dp" sub-mesh, each rank backpropagates `dp * loss`, and the
gradients are averaged over dp only (never over the tp ranks, which hold different
shards). Sequence parallelism (`ctx.sp > 1`, alone or with tp): the sp ranks of a dp
slot hold the same rows and the same parameters, each backpropagating its own positions'
part of the loss, so gradients average over dp x sp (the mesh's "dp_sp" dim under tp)
and each rank backpropagates `dp * sp * loss`; counts and metrics, summed over dp x sp,
are divided by sp. AdamW then runs per tensor (`foreach=False`: DTensors on two meshes
and plain tensors do not mix in one foreach call). Mixed precision: a module built in
bf16/fp16 (`model.dtype`) gets float32 master weights for its trainable parameters (so
AdamW updates and keeps its state in float32) and computes its forward in the low dtype
(`autocast()`); frozen parameters (LoRA's base) stay in the low dtype.
State: the module, its wrapper, optimizer, lr scheduler and backend.
"""
from __future__ import annotations

import math
import os
from typing import Callable

import torch
import torch.distributed as dist

from hybridflow.core.batch import Batch
from hybridflow.core.dtensor import local_shard
from hybridflow.workers.backends import make_backend
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.parallel.tensor_parallel import refuse_lora
from hybridflow.workers.micro_batches import micro_batches
from hybridflow.workers.lora import adapter_state_dict, is_lora, load_adapter, save_adapter
from hybridflow.workers.weights import WEIGHTS_FILE, full_state_dict, load_weights, save_weights

# the weight-file functions moved to weights.py; re-exported for existing callers
__all__ = ["Trainer", "full_state_dict", "save_weights", "load_weights", "lr_lambda",
           "WEIGHTS_FILE", "master_weights"]


def lr_lambda(warmup_steps: int, schedule: str, total_steps: int, min_lr_ratio: float = 0.0):
    """Multiplier of the base lr at optimizer step `s`: linear warm-up over
    `warmup_steps` (starting at 1/warmup, never 0), then constant or cosine."""
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"unknown lr_schedule {schedule!r}; use 'constant' or 'cosine'")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return factor


def master_weights(module: torch.nn.Module) -> torch.dtype:
    """Upcast the trainable parameters of a module built in bf16/fp16 to float32 (in
    place) and return the dtype the forward should compute in: the lowest floating
    dtype the module was built with."""
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    compute = min(dtypes, key=lambda d: torch.finfo(d).bits, default=torch.float32)
    for param in module.parameters():
        if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
            if hasattr(param, "device_mesh"):  # a DTensor's `.data =` keeps its low shard
                torch.utils.swap_tensors(param, torch.nn.Parameter(param.detach().float()))
            else:
                param.data = param.data.float()
    return compute


class Trainer:
    """Optimizer, schedule and the data-parallel backend around one module."""

    def __init__(self, module: torch.nn.Module, opt, ctx, device: torch.device):
        self.module, self.opt, self.ctx, self.device = module, opt, ctx, device
        tp = getattr(ctx, "tp", 1)
        lora = getattr(getattr(opt, "lora", None), "rank", 0)
        refuse_lora("actor", tp, lora)  # only the actor's section has LoRA
        mesh = ctx.device_mesh() if tp > 1 else None
        self.world = ctx.world_size if ctx.distributed else 1  # ranks the module spans
        self.sp = getattr(ctx, "sp", 1)  # ranks splitting one row (parallel/sequence_parallel.py)
        # data-parallel slots: the role's layout's under tp or sp (the mesh's "dp" dim)
        self.dp = ctx.layout.dp if mesh is not None or self.sp > 1 else self.world
        # ranks the gradient averages over: the parameters replicate over dp x sp
        self.grad_ranks = self.dp * self.sp
        # under tp, the mesh's outer dim: the ranks holding the same shard ("dp", or
        # "dp_sp" at sp > 1, `RoleLayout.replica_dim`); without tp every rank
        self.group = mesh[ctx.layout.replica_dim].get_group() \
            if mesh is not None and self.grad_ranks > 1 else None
        self.backend = make_backend(opt.strategy, self.grad_ranks, device,
                                    master_weights(module), mesh=mesh)
        self.model = self.backend.wrap(module)
        params = [p for p in module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=opt.lr, betas=tuple(opt.betas),
                                           weight_decay=opt.weight_decay,
                                           **({"foreach": False} if mesh is not None else {}))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(opt.warmup_steps, opt.lr_schedule, opt.total_steps,
                                      opt.min_lr_ratio))

    @property
    def fsdp(self) -> bool:
        """Whether parameters are sharded over the ranks (collective gathers needed)."""
        return self.backend.shards

    def autocast(self):
        """Context for forwards outside `train` (log-probs, values): the training
        compute dtype, so the ratio of new to old log-probs starts at exactly 1."""
        return self.backend.autocast()

    # ------------------------------------------------------------ collectives
    def all_reduce(self, tensor: torch.Tensor, op=None) -> torch.Tensor:
        """Over the data-parallel ranks (the dp sub-mesh under tp; every rank under sp,
        whose sp ranks hold the same rows: a sum counts them sp times)."""
        if self.grad_ranks > 1:
            dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM, group=self.group)
        return tensor

    def agreed_max(self, n: int) -> int:
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        return int(self.all_reduce(t, dist.ReduceOp.MAX).item())

    def dummy_loss(self) -> torch.Tensor:
        """A zero loss touching every parameter, for a rank with no rows left."""
        ids = torch.zeros(1, 2, dtype=torch.long, device=self.device)
        with self.backend.autocast():
            out = self.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        logits = out.logits  # a tensor-parallel head's: this rank's vocabulary shard
        return local_shard(logits).sum() * 0.0

    # ------------------------------------------------------------------- step
    def train(self, batch: Batch, loss_fn: Callable, *, epochs: int, mini_batch_size: int,
              micro_batch_size: int, mask_key: str = "response_mask", shuffle: bool = False,
              seed: int = 0, max_tokens: int | None = None,
              packed: bool = False, one_step: str | None = None) -> dict[str, float]:
        local_mini = max(1, math.ceil(mini_batch_size / self.dp))
        n_minis = self.agreed_max(math.ceil(len(batch) / local_mini))
        if one_step and epochs * n_minis > 1:  # every rank agrees: all raise together
            raise ValueError(
                f"{one_step} is valid for one optimizer step per batch, but this batch of "
                f"{len(batch)} rows on this rank makes {epochs} epoch(s) x {n_minis} "
                f"mini-batch(es) of {local_mini} rows per rank; the compiler removed the node "
                f"that computed those keys assuming one step: set "
                f"trainer.keep_unneeded_passes=true, or a mini-batch as large as the batch "
                f"and one epoch (docs/graphs.md#passes-the-compiler-removes)")
        totals: dict[str, float] = {}
        steps = 0
        self.module.train()
        with sequence_parallel(self.module, self.ctx):  # a no-op at sp=1
            for epoch in range(epochs):
                order = (torch.randperm(len(batch), generator=torch.Generator().manual_seed(
                    seed + epoch)) if shuffle else torch.arange(len(batch))).numpy()
                for j in range(n_minis):
                    mini = batch.take(order[j * local_mini:(j + 1) * local_mini]).to(self.device)
                    metrics = self._step(mini, loss_fn, micro_batch_size, mask_key, max_tokens,
                                         packed)
                    for k, v in metrics.items():
                        totals[k] = totals.get(k, 0.0) + v
                    steps += 1
        return {k: v / max(1, steps) for k, v in totals.items()}

    def _step(self, mini: Batch, loss_fn, micro_batch_size: int, mask_key: str,
              max_tokens: int | None = None, packed: bool = False) -> dict:
        if len(mini):
            mask = mini[mask_key]  # valid tokens, and sequences with at least one
            tokens, seqs = mask.sum(), (mask.sum(dim=-1) > 0).sum()
        else:
            tokens = seqs = torch.zeros((), device=self.device)
        counts = self.all_reduce(torch.stack([tokens, seqs]).to(torch.float64)) / self.sp
        micros = [m.batch for m in micro_batches(mini, micro_batch_size, max_tokens, packed)]
        n_micro = self.agreed_max(len(micros))
        self.optimizer.zero_grad(set_to_none=True)
        contrib: dict[str, torch.Tensor] = {}
        for k in range(n_micro):
            with self.backend.sync_context(self.model, last=k == n_micro - 1):
                if k < len(micros):
                    with self.backend.autocast():
                        loss, parts = loss_fn(self.model, micros[k], counts[0], counts[1])
                    for name, value in parts.items():
                        contrib[name] = contrib.get(name, 0.0) + value.detach().double()
                else:
                    loss = self.dummy_loss()
                (loss.float() * self.grad_ranks).backward()
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self.backend.clip_grad_norm(self.module, self.opt.grad_clip)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        names = sorted(contrib) if self.dp == 1 else self._agreed_names(contrib)
        vec = torch.stack([torch.as_tensor(contrib.get(n, 0.0), dtype=torch.float64,
                                           device=self.device) for n in names]) \
            if names else torch.zeros(0, dtype=torch.float64, device=self.device)
        vec = self.all_reduce(vec) / self.sp
        return {**dict(zip(names, vec.tolist())), "grad_norm": grad_norm, "lr": lr}

    def _agreed_names(self, contrib: dict) -> list[str]:
        gathered: list = [None] * self.grad_ranks
        dist.all_gather_object(gathered, sorted(contrib), group=self.group)
        return sorted({n for names in gathered for n in names})

    # ------------------------------------------------------------ checkpoint
    def trained_weights(self) -> dict[str, torch.Tensor]:
        """What a checkpoint holds: every weight, or only the adapters under LoRA."""
        weights = self.backend.full_state_dict(self.module)
        return adapter_state_dict(self.module, weights) if is_lora(self.module) else weights

    def save(self, directory: str, rank: int, tokenizer=None) -> None:
        """Full weights (or adapters) from rank 0, loadable by `from_pretrained`; this
        rank's optimizer state (its shard under FSDP2) and the schedule, per rank."""
        os.makedirs(directory, exist_ok=True)
        weights = self.backend.full_state_dict(self.module)  # collective when sharded
        if rank == 0:
            save = save_adapter if is_lora(self.module) else save_weights
            save(self.module, directory, weights)
            if tokenizer is not None:
                tokenizer.save_pretrained(directory)
        torch.save({"optimizer": self.backend.optimizer_state(self.optimizer),
                    "scheduler": self.scheduler.state_dict()},
                   self.backend.optimizer_file(directory, rank))

    def load(self, directory: str, rank: int) -> None:
        (load_adapter if is_lora(self.module) else load_weights)(self.module, directory)
        path = self.backend.optimizer_file(directory, rank)
        if not os.path.exists(path):
            raise FileNotFoundError(f"checkpoint {directory!r} has no optimizer state for rank "
                                    f"{rank} ({os.path.basename(path)}); was it saved with the "
                                    "same number of ranks?")
        from hybridflow.core.loading import read_torch
        state = read_torch(path, "checkpoint optimizer state",
                           fix="the checkpoint is damaged or was tampered with: resume from "
                               "the checkpoint before it")
        if not isinstance(state, dict) or not {"optimizer", "scheduler"} <= set(state):
            raise ValueError(f"checkpoint optimizer state {path!r} lacks its 'optimizer' "
                             f"and 'scheduler' entries: the checkpoint is damaged")
        self.backend.load_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
