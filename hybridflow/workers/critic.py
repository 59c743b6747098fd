"""CriticWorker: a value head on a causal-LM backbone; `values` and `update`.

Reads the `model` (backbone, tokenizer, dtype, device) and `critic` sections. The
value of response token t is read at the position that predicts it (the same slice
as the log-probs, `[:, -R - 1:-1]`), as in verl.
"""
from __future__ import annotations

import torch

from hybridflow.batch import Batch
from hybridflow.dispatch import DP, method
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import CriticConfig, ModelConfig, read_section
from hybridflow.workers.models import build_value_model
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from hybridflow.workers.training import Trainer

__all__ = ["CriticWorker"]

VALUE_READS = ("input_ids", "attention_mask", "position_ids", "responses")


def response_values(model, batch: Batch) -> torch.Tensor:
    """Value per response token [B, R], float32, masked to 0 outside `response_mask`."""
    width = batch["responses"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    values = out.logits.squeeze(-1)[:, -width - 1:-1].float()
    if "response_mask" in batch:
        values = values * batch["response_mask"].to(values.dtype)
    return values


class CriticWorker(Worker):
    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.critic_cfg = read_section(cfg, "critic", CriticConfig)
        self.device = self._device(self.model_cfg.device)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        self.module = build_value_model(self.model_cfg, self.tokenizer, self.device,
                                        self.ctx.seed, path=self.critic_cfg.path)
        self.ctx.init_distributed()  # DDP/FSDP gradients need the process group
        self.trainer = Trainer(self.module, self.critic_cfg, self.ctx, self.device)

    @method(dispatch=DP, reads=VALUE_READS, writes=("values",), kind="inference",
            optional=("response_mask",))
    @torch.no_grad()
    def values(self, batch: Batch, micro_batch_size: int | None = None) -> Batch:
        """V(s_t) for each response token, [B, R] float32."""
        width = batch["responses"].shape[1]
        mbs = micro_batch_size or self.critic_cfg.micro_batch_size
        parts = [response_values(self.module, batch.take(slice(i, i + mbs)).to(self.device))
                 .cpu() for i in range(0, len(batch), mbs)]
        values = torch.cat(parts) if parts else torch.zeros(0, width)
        return metrics_batch(Batch({"values": values}), {})

    @method(dispatch=DP, reads=VALUE_READS + ("response_mask", "values", "returns"),
            writes=(), kind="train")
    def update(self, batch: Batch) -> Batch:
        """Clipped value-loss epochs over mini-batches of micro-batches."""
        from algorithms.losses import value_loss
        from algorithms.masked import masked_mean
        cfg = self.critic_cfg

        def loss_fn(model, micro: Batch, tokens, seqs):
            mask = micro["response_mask"]
            vpreds = response_values(model, micro)
            loss, metrics = value_loss(vpreds, micro["values"], micro["returns"], mask,
                                       clip=cfg.cliprange_value, mode=cfg.loss_agg_mode,
                                       global_tokens=tokens, global_seqs=seqs,
                                       norm_constant=float(mask.shape[1]))
            share = mask.sum() / tokens.clamp(min=1)
            return loss, {"vf_loss": loss, "vf_clipfrac": metrics["vf_clipfrac"] * share,
                          "values/mean": masked_mean(vpreds.detach(), mask) * share}

        keys = VALUE_READS + ("response_mask", "values", "returns")
        data = batch.select(*keys) if len(batch) else batch
        metrics = self.trainer.train(data, loss_fn, epochs=cfg.ppo_epochs,
                                     mini_batch_size=cfg.mini_batch_size,
                                     micro_batch_size=cfg.micro_batch_size,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        return metrics_batch(Batch(), {f"critic/{k}": v for k, v in metrics.items()})
