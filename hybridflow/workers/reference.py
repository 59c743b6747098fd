"""ReferenceWorker: a frozen copy of the initial policy; `logprob` only.

Reads the `model`, `rollout` (temperature, as the actor's log-probs use it) and `ref`
sections. Built with the same seed as the actor, so a model built from a config is
bit-identical to the actor's initial weights without any copy between them.
"""
from __future__ import annotations

from hybridflow.batch import Batch
from hybridflow.dispatch import DP, method
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ModelConfig, RefConfig, RolloutConfig, read_section
from hybridflow.workers.models import build_causal_lm
from hybridflow.workers.sequences import response_logprobs
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec

__all__ = ["ReferenceWorker"]


class ReferenceWorker(Worker):
    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.ref_cfg = read_section(cfg, "ref", RefConfig)
        self.temperature = read_section(cfg, "rollout", RolloutConfig).temperature
        self.device = self._device(self.model_cfg.device)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        self.module = build_causal_lm(self.model_cfg, self.tokenizer, self.device,
                                      self.ctx.seed, path=self.ref_cfg.path)
        self.module.eval().requires_grad_(False)

    @method(dispatch=DP, reads=("input_ids", "attention_mask", "position_ids", "responses"),
            writes=("ref_log_prob",), kind="inference")
    def logprob(self, batch: Batch, micro_batch_size: int | None = None,
                temperature: float | None = None) -> Batch:
        """Log-prob of each response token under the frozen initial policy, [B, R]."""
        temp = self.temperature if temperature is None else temperature
        logp, _ = response_logprobs(self.module, batch,
                                    micro_batch_size or self.ref_cfg.micro_batch_size,
                                    self.device, temp)
        return metrics_batch(Batch({"ref_log_prob": logp}), {})
