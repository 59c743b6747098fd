"""ReferenceWorker: the frozen initial policy; `logprob` only.

Reads the `model`, `rollout` (temperature, as the actor's log-probs use it), `ref`
and `actor` (its LoRA rank) sections. Built with the same seed as the actor, so a
model built from a config is bit-identical to the actor's initial weights without
any copy between them.

`ref.prepacked_linear` runs the linear layers of its own float32 model through
oneDNN's prepacked kernel for each call (workers/rollout/prepacked.py): the weights
never change, and on some CPUs MKL's `F.linear` runs far below oneDNN there.

Folded: when the actor trains LoRA adapters and `ref.path` is unset, the initial
policy *is* the actor with its adapters off. The reference then builds no model: it
borrows the module of the colocated actor (`ctx.colocated[HOST_ROLE]`) under
`base_policy()` for each call. `served_by(cfg)` tells the engine so before launch,
and the compiler checks that the two roles share a pool (one process).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import DP, method
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import (ActorConfig, ModelConfig, RefConfig, RolloutConfig,
                                       read_section)
from hybridflow.workers.mfu import FORWARD, phase_mfu, real_tokens
from hybridflow.workers.models import build_causal_lm, resolve_dtype, role_tp_mesh
from hybridflow.workers.sequences import response_logprobs
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.rollout.prepacked import prepacked_linears
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

__all__ = ["ReferenceWorker"]


class ReferenceWorker(Worker):
    HOST_ROLE = "actor"  # the role whose adapters-off module is the initial policy

    @classmethod
    def served_by(cls, cfg) -> str | None:
        """The colocated role that serves this one, or None when it holds its own model."""
        lora = read_section(cfg, "actor", ActorConfig).lora.rank > 0
        return cls.HOST_ROLE if lora and read_section(cfg, "ref", RefConfig).path is None \
            else None

    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.ref_cfg = read_section(cfg, "ref", RefConfig)
        self.temperature = read_section(cfg, "rollout", RolloutConfig).temperature
        self.device = self._device(self.model_cfg.device)
        self.host = self.served_by(cfg)
        self._own = None
        if self.host is None:
            self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
            self._own = build_causal_lm(self.model_cfg, self.tokenizer, self.device,
                                        self.ctx.seed, path=self.ref_cfg.path,
                                        tp_mesh=role_tp_mesh(self.ctx))  # ref.tp>1: shard
            self._own.eval().requires_grad_(False)

    def _host_worker(self):
        worker = self.ctx.colocated.get(self.host)
        if worker is None or not hasattr(worker, "base_policy"):
            raise RuntimeError(
                f"role 'ref' is served by role '{self.host}' (actor.lora.rank > 0 and "
                f"ref.path unset) but no '{self.host}' worker with base_policy() lives in "
                f"this process (colocated: {sorted(self.ctx.colocated)}); place both roles "
                "on one pool, or set ref.path to give the reference its own model")
        return worker

    @property
    def module(self):
        """The model this role computes with: its own, or the host's (adapters included;
        they are switched off for each call)."""
        return self._own if self.host is None else self._host_worker().module

    def _policy(self):
        return nullcontext(self._own) if self.host is None else \
            self._host_worker().base_policy()

    def _prepacks(self) -> bool:
        """`ref.prepacked_linear` applies to the reference's own model only: a folded
        reference computes with the actor's module, which trains."""
        return self.ref_cfg.prepacked_linear and self.host is None

    @method(dispatch=DP, reads=("input_ids", "attention_mask", "position_ids", "responses"),
            writes=("ref_log_prob",), kind="inference")
    def logprob(self, batch: Batch, micro_batch_size: int | None = None,
                temperature: float | None = None,
                max_tokens_per_micro_batch: int | None = None) -> Batch:
        """Log-prob of each response token under the frozen initial policy, [B, R]."""
        temp = self.temperature if temperature is None else temperature
        began = time.perf_counter()
        with self._policy() as model, sequence_parallel(model, self.ctx), \
                prepacked_linears(model, enabled=self._prepacks()):
            logp, _ = response_logprobs(model, batch,
                                        micro_batch_size or self.ref_cfg.micro_batch_size,
                                        self.device, temp, max_tokens=max_tokens_per_micro_batch
                                        or self.ref_cfg.max_tokens_per_micro_batch,
                                        packed=self.model_cfg.use_remove_padding,
                                        logprob_chunk=self.ref_cfg.logprob_chunk)
            mfu = phase_mfu(model, self.device, resolve_dtype(self.model_cfg.dtype), FORWARD,
                            real_tokens(batch), began)
        return metrics_batch(Batch({"ref_log_prob": logp}), mfu)
