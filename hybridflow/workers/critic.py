"""CriticWorker: a value head on a causal-LM backbone; `values` and `update`.

Reads the `model` (backbone, tokenizer, dtype, device) and `critic` sections. The
value of response token t is read at the position that predicts it (the same slice
as the log-probs, `[:, -R - 1:-1]`), as in verl.
"""
from __future__ import annotations

import time

import torch

from hybridflow.core.batch import Batch
from hybridflow.graph.dispatch import DP, method
from hybridflow.graph.loss import takes_loss
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import CriticConfig, ModelConfig, read_section
from hybridflow.workers.mfu import FORWARD, TRAIN, phase_mfu, real_tokens
from hybridflow.workers.models import build_value_model, role_tp_mesh
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from hybridflow.workers.loss_inputs import (ValueOutputs, run_loss, select_for_loss,
                                            worker_default_loss)
from hybridflow.workers.sequences import response_values_batched, training_mask_key
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.training import Trainer

__all__ = ["CriticWorker"]

VALUE_READS = ("input_ids", "attention_mask", "position_ids", "responses")
VALUE_INPUTS = VALUE_READS + ("response_mask",)  # what the update's forward needs


class CriticWorker(Worker):
    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.critic_cfg = read_section(cfg, "critic", CriticConfig)
        self.device = self._device(self.model_cfg.device)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        self.module = build_value_model(self.model_cfg, self.tokenizer, self.device,
                                        self.ctx.seed, path=self.critic_cfg.path,
                                        tp_mesh=role_tp_mesh(self.ctx))  # tp>1: its shard
        self.ctx.init_distributed()  # DDP/FSDP gradients need the process group
        self.trainer = Trainer(self.module, self.critic_cfg, self.ctx, self.device)

    @method(dispatch=DP, reads=VALUE_READS, writes=("values",), kind="inference",
            optional=("response_mask",))
    @torch.no_grad()
    def values(self, batch: Batch, micro_batch_size: int | None = None,
               max_tokens_per_micro_batch: int | None = None) -> Batch:
        """V(s_t) for each response token, [B, R] float32."""
        began = time.perf_counter()
        with self.trainer.autocast(), sequence_parallel(self.module, self.ctx):
            values = response_values_batched(
                self.module, batch, micro_batch_size or self.critic_cfg.micro_batch_size,
                self.device,
                max_tokens_per_micro_batch or self.critic_cfg.max_tokens_per_micro_batch,
                packed=self.model_cfg.use_remove_padding)
        return metrics_batch(Batch({"values": values}),
                             self._mfu(FORWARD, real_tokens(batch), began))

    @takes_loss(model_reads=VALUE_INPUTS)
    @method(dispatch=DP, reads=VALUE_INPUTS + ("values", "returns"), writes=(), kind="train",
            optional=("loss_mask",))
    def update(self, batch: Batch, loss=None, epochs: int | None = None) -> Batch:
        """Epochs over mini-batches of micro-batches minimising `loss(micro, out)` with
        `out.values` the current predictions (the graph's loss; by default the one
        registered for critic.update, chosen from the critic config: the clipped value loss).
        Tokens are counted and masked by the training mask, as in `actor.update`:
        `loss_mask` in an agent batch (model tokens only), else `response_mask`."""
        cfg, began = self.critic_cfg, time.perf_counter()
        loss = loss if loss is not None else worker_default_loss(self, "critic.update", cfg)
        mask_key = training_mask_key(batch)
        inputs = VALUE_INPUTS + ((mask_key,) if mask_key not in VALUE_INPUTS else ())
        data = select_for_loss(batch, inputs, loss, "critic.update")
        packed = self.model_cfg.use_remove_padding

        def trainer_loss(model, micro: Batch, tokens, seqs):
            return run_loss(loss, micro, ValueOutputs(model, micro, tokens, seqs, mask_key,
                                                      packed=packed))

        epochs = cfg.ppo_epochs if epochs is None else epochs
        metrics = self.trainer.train(data, trainer_loss, mask_key=mask_key, epochs=epochs,
                                     mini_batch_size=cfg.mini_batch_size,
                                     micro_batch_size=cfg.micro_batch_size,
                                     max_tokens=cfg.max_tokens_per_micro_batch, packed=packed,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        return metrics_batch(Batch(), {**{f"critic/{k}": v for k, v in metrics.items()},
                                       **self._mfu(TRAIN * epochs, real_tokens(data), began)})

    def _mfu(self, flops_per_param_token: int, tokens: int, began: float) -> dict:
        """`perf/mfu` of a phase of the value model (workers/mfu.py)."""
        return phase_mfu(self.module, self.device, self.trainer.backend.compute_dtype,
                         flops_per_param_token, tokens, began)
