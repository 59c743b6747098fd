"""ActorWorker: the policy. Generates rollouts, scores their log-probs, trains on them.

Reads the `model`, `actor` and `rollout` config sections. The rollout engine shares
the training module (HF backend), so weights are fresh after every update with no
copy; the vLLM backend receives them through `load_weights` before each generate.
Data parallel over the ranks of its pool: DDP (default) or FSDP2 (`actor.strategy`,
see `backends/`), and `training.Trainer` for how updates stay identical to a
single-rank update. The loss is the graph's (`update(loss=...)`, `hybridflow/loss.py`);
with `model.dtype=bf16` the trained weights stay float32 and the forwards run in bf16.
With `actor.lora.rank > 0` only LoRA adapters train (see `lora.py`), and
`base_policy()` lends the module with its adapters off to a colocated reference.
"""
from __future__ import annotations

import time

from hybridflow.batch import Batch
from hybridflow.dispatch import DP, method
from hybridflow.loss import takes_loss
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ActorConfig, ModelConfig, RolloutConfig, read_section
from hybridflow.workers.lora import adapters_disabled, apply_lora, is_lora, merged_state_dict
from hybridflow.workers.models import build_causal_lm
from hybridflow.workers.rollout_hf import HFRollout, sampling_options
from hybridflow.workers.loss_inputs import (PolicyOutputs, run_loss, select_for_loss,
                                           worker_default_loss)
from hybridflow.workers.sequences import masked_mean, response_logprobs
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from hybridflow.workers.training import Trainer

__all__ = ["ActorWorker", "GENERATE_WRITES"]

GENERATE_WRITES = ("prompts", "responses", "response_mask", "input_ids", "attention_mask",
                   "position_ids", "response_length")
LOGPROB_READS = ("input_ids", "attention_mask", "position_ids", "responses")
POLICY_INPUTS = LOGPROB_READS + ("response_mask",)  # what the update's forward needs
UPDATE_READS = POLICY_INPUTS + ("old_log_probs", "advantages")  # and the default loss
SFT_READS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


class ActorWorker(Worker):
    def __init__(self, cfg, ctx=None):
        super().__init__(cfg, ctx)
        self.model_cfg = read_section(cfg, "model", ModelConfig)
        self.actor_cfg = read_section(cfg, "actor", ActorConfig)
        self.rollout_cfg = read_section(cfg, "rollout", RolloutConfig)
        self.device = self._device(self.model_cfg.device)
        self.tokenizer = load_tokenizer(tokenizer_spec(self.model_cfg))
        module = build_causal_lm(self.model_cfg, self.tokenizer, self.device, self.ctx.seed)
        self.module = apply_lora(module, self.actor_cfg.lora)
        self.ctx.init_distributed()  # DDP/FSDP gradients need the process group
        self.trainer = Trainer(self.module, self.actor_cfg, self.ctx, self.device)
        self.rollout = self._make_rollout()

    def _make_rollout(self):
        if self.rollout_cfg.backend == "hf":
            return HFRollout(self.module, self.tokenizer, self.rollout_cfg, self.device,
                             synced_gpus=self.trainer.fsdp and self.ctx.distributed)
        if self.rollout_cfg.backend == "vllm":
            from hybridflow.workers.rollout_vllm import VLLMRollout
            return VLLMRollout(self.model_cfg, self.rollout_cfg, self.tokenizer, self.ctx)
        raise ValueError(f"unknown rollout backend {self.rollout_cfg.backend!r}; "
                         "use 'hf' or 'vllm'")

    # ------------------------------------------------------------------- lora
    @property
    def lora(self) -> bool:
        return is_lora(self.module)

    def base_policy(self):
        """Context manager: the initial policy, i.e. this module with its LoRA adapters
        off (what a colocated reference borrows instead of holding a second copy)."""
        if not self.lora:
            raise ValueError("base_policy() needs actor.lora.rank > 0: without adapters the "
                             "actor's weights are no longer the initial policy")
        return adapters_disabled(self.module)

    def export(self, directory: str, merged: bool = True) -> None:
        """Write the current policy as a Hugging Face model directory (adapters merged
        into the base when `merged`, else peft's adapter files only). Every rank calls
        it (the gather is collective under FSDP2); rank 0 writes."""
        from hybridflow.workers.lora import save_adapter
        from hybridflow.workers.weights import save_weights
        weights = self.trainer.backend.full_state_dict(self.module)
        if self.ctx.rank != 0:
            return
        if self.lora and not merged:
            save_adapter(self.module, directory, weights)
        else:
            weights = merged_state_dict(self.module, weights) if self.lora else weights
            base = self.module.get_base_model() if self.lora else self.module
            save_weights(base, directory, weights)
        self.tokenizer.save_pretrained(directory)

    # --------------------------------------------------------------- generate
    @method(dispatch=DP, reads=("input_ids", "attention_mask"), writes=GENERATE_WRITES,
            kind="generate", overwrites=("input_ids", "attention_mask", "position_ids"),
            forwards=True)
    def generate(self, batch: Batch, n: int | None = None, temperature: float | None = None,
                 top_p: float | None = None, top_k: int | None = None,
                 max_new_tokens: int | None = None, do_sample: bool | None = None) -> Batch:
        """n responses per prompt (rows repeated interleaved: aabb), each carrying its
        prompt's other columns (uid, data_source, ground_truth, ...)."""
        opts = sampling_options(self.rollout_cfg, n=n, temperature=temperature, top_p=top_p,
                                top_k=top_k, max_new_tokens=max_new_tokens, do_sample=do_sample)
        sync_s = self.rollout.sync_weights(self.module)
        start = time.perf_counter()
        prompts = batch.repeat(opts.n, interleave=True)
        rollout = self.rollout.generate(prompts.select("input_ids", "attention_mask"), opts)
        gen_s = time.perf_counter() - start
        out = prompts.drop("position_ids").update(rollout)
        lengths = rollout["response_length"].float()
        return metrics_batch(out, {
            "rollout/weight_sync_s": sync_s,
            "rollout/gen_s": gen_s,
            "rollout/tokens_per_s": float(lengths.sum()) / max(gen_s, 1e-9),
            "response_length/mean": float(lengths.mean()) if len(lengths) else 0.0,
        })

    # ---------------------------------------------------------------- logprob
    @method(dispatch=DP, reads=LOGPROB_READS, writes=("old_log_probs",), kind="inference",
            optional=("response_mask",))
    def logprob(self, batch: Batch, micro_batch_size: int | None = None,
                with_entropy: bool = False, temperature: float | None = None) -> Batch:
        """Log-prob of each response token under the current weights, [B, R] float32."""
        mbs = micro_batch_size or self.rollout_cfg.log_prob_micro_batch_size
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        with self.trainer.autocast():  # the update's compute dtype: first ratios are 1
            logp, ent = response_logprobs(self.module, batch, mbs, self.device, temp,
                                          with_entropy)
        metrics = {}
        if ent is not None and "response_mask" in batch and len(batch):
            metrics["actor/entropy"] = float(masked_mean(ent, batch["response_mask"].cpu()))
        return metrics_batch(Batch({"old_log_probs": logp}), metrics)

    # ----------------------------------------------------------------- update
    @takes_loss(model_reads=POLICY_INPUTS)
    @method(dispatch=DP, reads=UPDATE_READS, writes=(), kind="train", optional=("ref_log_prob",))
    def update(self, batch: Batch, temperature: float | None = None, loss=None,
               epochs: int | None = None) -> Batch:
        """Epochs over mini-batches (one optimizer step each) of micro-batches, minimising
        `loss(micro, out)` (the graph's; by default the one registered for actor.update,
        chosen from the actor config). `epochs` defaults to `actor.ppo_epochs`."""
        cfg = self.actor_cfg
        loss = loss if loss is not None else worker_default_loss(self, "actor.update", cfg)
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        data = select_for_loss(batch, POLICY_INPUTS, loss, "actor.update")

        def trainer_loss(model, micro: Batch, tokens, seqs):
            return run_loss(loss, micro, PolicyOutputs(model, micro, tokens, seqs,
                                                       temperature=temp))

        metrics = self.trainer.train(data, trainer_loss,
                                     epochs=cfg.ppo_epochs if epochs is None else epochs,
                                     mini_batch_size=cfg.mini_batch_size,
                                     micro_batch_size=cfg.micro_batch_size,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        return metrics_batch(Batch(), {f"actor/{k}": v for k, v in metrics.items()})

    # -------------------------------------------------------------------- sft
    @takes_loss(model_reads=SFT_READS)
    @method(dispatch=DP, reads=SFT_READS, writes=(), kind="train")
    def sft(self, batch: Batch, epochs: int = 1, mini_batch_size: int | None = None,
            micro_batch_size: int | None = None, loss=None) -> Batch:
        """Supervised training on the tokens where `loss_mask` is 1 (token t is predicted
        from tokens < t; position 0 is never a target): the loss sees them as
        `responses` = input_ids[:, 1:] with `response_mask` = loss_mask[:, 1:], so
        `out.log_probs` are the targets' log-probs. Default loss: token-mean NLL."""
        cfg = self.actor_cfg
        loss = loss if loss is not None else worker_default_loss(self, "actor.sft", cfg)
        data = select_for_loss(batch, SFT_READS, loss, "actor.sft")
        if len(data):
            data["responses"] = data["input_ids"][:, 1:]
            data["response_mask"] = data["loss_mask"][:, 1:].long()

        def trainer_loss(model, micro: Batch, tokens, seqs):
            return run_loss(loss, micro, PolicyOutputs(model, micro, tokens, seqs))

        metrics = self.trainer.train(data, trainer_loss, epochs=epochs,
                                     mini_batch_size=mini_batch_size or cfg.mini_batch_size,
                                     micro_batch_size=micro_batch_size or cfg.micro_batch_size,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        return metrics_batch(Batch(), {f"actor/{k}": v for k, v in metrics.items()})
