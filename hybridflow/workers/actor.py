"""ActorWorker: the policy. Generates rollouts, scores their log-probs, trains on them.

Reads the `model`, `actor` and `rollout` config sections. `generate` runs on the
actor's own rollout engine (`rollout.backend`, see `hybridflow/workers/rollout/`),
built at the first generate: the `hf` engine shares the training module, so weights
are fresh after every update with no copy; the `vllm` engine receives them bucket by
bucket before a generate when they changed. A `rollout` role colocated with the
actor borrows this engine; one on its own pool receives `export_weights`.
State beyond the model and trainer: `policy_version` (updates applied so far,
checkpointed with the weights) and `_engine`.
Data parallel over the ranks of its pool: DDP (default) or FSDP2 (GPU), see
`training.Trainer` for how updates stay identical to a single-rank update.
With `actor.lora.rank > 0` only LoRA adapters train (see `lora.py`), and
`base_policy()` lends the module with its adapters off to a colocated reference.
"""
from __future__ import annotations

import json
import os

import torch

from hybridflow.batch import Batch
from hybridflow.dispatch import DP, RANK_ZERO, method
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ActorConfig, ModelConfig, RolloutConfig, read_section
from hybridflow.workers.lora import adapters_disabled, apply_lora, is_lora, merged_state_dict
from hybridflow.workers.models import build_causal_lm
from hybridflow.workers.rollout.engine import EngineSpec, check_engine_name, make_engine
from hybridflow.workers.rollout.generation import (GENERATE_WRITES, generate_rows,
                                                   logprob_mismatch, sampling_options)
from hybridflow.workers.rollout.weights import (WEIGHT_KEYS, pack_weights, policy_weights,
                                                refresh_engine)
from hybridflow.workers.sequences import forward_response, response_logprobs
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from hybridflow.workers.training import Trainer

__all__ = ["ActorWorker", "GENERATE_WRITES"]

VERSION_FILE = "policy_version.json"
LOGPROB_READS = ("input_ids", "attention_mask", "position_ids", "responses")
UPDATE_READS = LOGPROB_READS + ("response_mask", "old_log_probs", "advantages")


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
        self.policy_version = 0  # actor updates applied to these weights
        self._engine = None  # built at the first generate: a rollout on its own pool
        check_engine_name(self.rollout_cfg.backend)  # may leave it unused

    def _make_rollout(self):
        """This actor's engine over its own module (shared by a colocated rollout)."""
        return make_engine(EngineSpec(self.model_cfg, self.rollout_cfg, self.tokenizer, self.ctx,
                                      self.device, module=self.module,
                                      synced_gpus=self.trainer.fsdp and self.ctx.distributed))

    @property
    def engine(self):
        if self._engine is None:
            self._engine = self._make_rollout()
        return self._engine

    rollout = engine  # the name this attribute had before engines were pluggable

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
        into the base when `merged`, else peft's adapter files only); rank 0 writes."""
        from hybridflow.workers.lora import save_adapter
        from hybridflow.workers.training import full_state_dict, save_weights
        if self.ctx.rank != 0:
            return
        if self.lora and not merged:
            save_adapter(self.module, directory, full_state_dict(self.module))
        else:
            weights = merged_state_dict(self.module) if self.lora else None
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
        prompt's other columns (uid, data_source, ground_truth, ...), the engine's
        `rollout_log_probs` and the `policy_version` of the weights that sampled it."""
        opts = sampling_options(self.rollout_cfg, n=n, temperature=temperature, top_p=top_p,
                                top_k=top_k, max_new_tokens=max_new_tokens, do_sample=do_sample)
        engine = self.engine
        sync_s = refresh_engine(engine, self.module, self.policy_version, self._bucket_bytes())
        out = generate_rows(engine, batch, opts, sync_s)
        if not engine.shares_module:
            engine.sleep()  # colocated engine with its own copy: give training the memory
        return out

    # ---------------------------------------------------------- weight export
    def _bucket_bytes(self) -> int:
        return max(1, int(self.rollout_cfg.weight_bucket_mb * 2**20))

    @method(dispatch=RANK_ZERO, reads=(), writes=WEIGHT_KEYS, kind="inference")
    def export_weights(self, batch: Batch) -> Batch:
        """The current policy for a rollout on another pool (the weight-sync edge):
        one row holding every weight in buckets, and the policy version."""
        if self.trainer.fsdp and self.ctx.world_size > 1:
            raise NotImplementedError(
                "a rollout on its own pool with actor.strategy=fsdp2 on several ranks needs a "
                "collective export, which is not written yet: colocate the rollout with the "
                "actor (drop placement.roles.rollout) or use actor.strategy=ddp")
        export = pack_weights(policy_weights(self.module), self.policy_version,
                              self._bucket_bytes())
        return metrics_batch(export, {"actor/policy_version": self.policy_version})

    def save_checkpoint(self, directory: str) -> None:
        super().save_checkpoint(directory)
        if self.ctx.rank == 0:
            with open(os.path.join(directory, VERSION_FILE), "w") as fh:
                json.dump({"policy_version": self.policy_version}, fh)

    def load_checkpoint(self, directory: str) -> None:
        super().load_checkpoint(directory)
        path = os.path.join(directory, VERSION_FILE)
        if os.path.exists(path):  # checkpoints from before versions were counted: 0
            with open(path) as fh:
                self.policy_version = int(json.load(fh)["policy_version"])

    # ---------------------------------------------------------------- logprob
    @method(dispatch=DP, reads=LOGPROB_READS, writes=("old_log_probs",), kind="inference",
            optional=("response_mask", "rollout_log_probs"))
    def logprob(self, batch: Batch, micro_batch_size: int | None = None,
                with_entropy: bool = False, temperature: float | None = None) -> Batch:
        """Log-prob of each response token under the current weights, [B, R] float32."""
        mbs = micro_batch_size or self.rollout_cfg.log_prob_micro_batch_size
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        logp, ent = response_logprobs(self.module, batch, mbs, self.device, temp, with_entropy)
        metrics = {}
        if ent is not None and "response_mask" in batch and len(batch):
            from algorithms.masked import masked_mean
            metrics["actor/entropy"] = float(masked_mean(ent, batch["response_mask"].cpu()))
        if "rollout_log_probs" in batch and "response_mask" in batch:  # engine vs trainer
            metrics.update(logprob_mismatch(batch["rollout_log_probs"], logp,
                                            batch["response_mask"]))
        return metrics_batch(Batch({"old_log_probs": logp}), metrics)

    # ----------------------------------------------------------------- update
    @method(dispatch=DP, reads=UPDATE_READS, writes=(), kind="train", optional=("ref_log_prob",))
    def update(self, batch: Batch, temperature: float | None = None) -> Batch:
        """PPO epochs over mini-batches (one optimizer step each) of micro-batches."""
        cfg = self.actor_cfg
        if cfg.use_kl_loss and len(batch) and "ref_log_prob" not in batch:
            raise KeyError("actor.use_kl_loss is on but the update's input has no "
                           "'ref_log_prob': add ref.logprob to the graph's update inputs")
        from algorithms.losses import get_policy_loss
        policy_loss = get_policy_loss(cfg.policy_loss)
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        keys = UPDATE_READS + (("ref_log_prob",) if cfg.use_kl_loss else ())
        data = batch.select(*keys) if len(batch) else batch

        def loss_fn(model, micro: Batch, tokens, seqs):
            return self._ppo_loss(model, micro, tokens, seqs, policy_loss, temp)

        metrics = self.trainer.train(data, loss_fn, epochs=cfg.ppo_epochs,
                                     mini_batch_size=cfg.mini_batch_size,
                                     micro_batch_size=cfg.micro_batch_size,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        self.policy_version += 1  # what every later generated row is stamped with
        return metrics_batch(Batch(), {f"actor/{k}": v for k, v in metrics.items()})

    def _ppo_loss(self, model, micro: Batch, tokens, seqs, policy_loss, temperature: float):
        from algorithms.losses import aggregate
        from algorithms.masked import masked_mean
        cfg = self.actor_cfg
        mask = micro["response_mask"]
        need_entropy = cfg.entropy_coeff != 0
        logp, ent = forward_response(model, micro, temperature, with_entropy=True,
                                     entropy_grad=need_entropy)
        kwargs = dict(mode=cfg.loss_agg_mode, global_tokens=tokens, global_seqs=seqs,
                      norm_constant=float(mask.shape[1]))
        extra = {"clip_c": cfg.clip_c} if cfg.policy_loss == "ppo" else {}
        pg_loss, pg_metrics = policy_loss(logp, micro["old_log_probs"], micro["advantages"],
                                          mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                          **extra, **kwargs)
        loss = pg_loss
        share = mask.sum() / tokens.clamp(min=1)  # this micro-batch's share of the tokens
        parts = {"pg_loss": pg_loss, **{k: v * share for k, v in pg_metrics.items()}}
        if need_entropy:
            entropy = aggregate(ent, mask, **kwargs)
            loss = loss - cfg.entropy_coeff * entropy
            parts["entropy"] = entropy
        if cfg.use_kl_loss:
            from algorithms.kl import kl_penalty
            kl = aggregate(kl_penalty(logp, micro["ref_log_prob"], cfg.kl_loss_type), mask,
                           **kwargs)
            loss = loss + cfg.kl_loss_coef * kl
            parts["kl_loss"] = kl
        else:
            parts["entropy"] = masked_mean(ent, mask) * share
        return loss, parts

    # -------------------------------------------------------------------- sft
    @method(dispatch=DP, reads=("input_ids", "attention_mask", "position_ids", "loss_mask"),
            writes=(), kind="train")
    def sft(self, batch: Batch, epochs: int = 1, mini_batch_size: int | None = None,
            micro_batch_size: int | None = None) -> Batch:
        """Cross-entropy on the tokens where `loss_mask` is 1 (token t is predicted
        from tokens < t; position 0 is never a target). Used to make the toy base model."""
        cfg = self.actor_cfg
        data = batch.select("input_ids", "attention_mask", "position_ids") \
            if len(batch) else batch
        if len(batch):
            data["target_mask"] = batch["loss_mask"][:, 1:].long()

        def loss_fn(model, micro: Batch, tokens, seqs):
            from algorithms.losses import aggregate
            out = model(input_ids=micro["input_ids"], attention_mask=micro["attention_mask"],
                        position_ids=micro["position_ids"], use_cache=False)
            logits = out.logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(
                logits.transpose(1, 2), micro["input_ids"][:, 1:], reduction="none")
            loss = aggregate(nll, micro["target_mask"], "token-mean", global_tokens=tokens)
            return loss, {"sft_loss": loss}

        metrics = self.trainer.train(data, loss_fn, epochs=epochs,
                                     mini_batch_size=mini_batch_size or cfg.mini_batch_size,
                                     micro_batch_size=micro_batch_size or cfg.micro_batch_size,
                                     mask_key="target_mask", shuffle=cfg.shuffle,
                                     seed=self.ctx.seed)
        return metrics_batch(Batch(), {f"actor/{k}": v for k, v in metrics.items()})
