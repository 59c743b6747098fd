"""ActorWorker: the policy. Generates rollouts, scores their log-probs, trains on them.

Reads the `model`, `actor` and `rollout` config sections. `generate` runs on the
actor's own rollout engine (`rollout.backend`, see `hybridflow/workers/rollout/`),
built at the first generate: the `hf` engine shares the training module, so weights
are fresh after every update with no copy; the `vllm` engine receives them bucket by
bucket before a generate when they changed. A `rollout` role colocated with the
actor borrows this engine; one on its own pool receives `export_weights`.
State beyond the model and trainer: `policy_version` (updates applied so far,
checkpointed with the weights) and `_engine`.
Data parallel over the ranks of its pool: DDP (default) or FSDP2 (`actor.strategy`,
see `backends/`), and `training.Trainer` for how updates stay identical to a
single-rank update; with `placement.parallel.actor.tp > 1` (fsdp2) each tp group shards
the module (`parallel/tensor_parallel.py`) and the hf engine generates on it. The
loss is the graph's (`update(loss=...)`, `hybridflow/graph/loss.py`);
with `model.dtype=bf16` the trained weights stay float32 and the forwards run in bf16.
With `actor.lora.rank > 0` only LoRA adapters train (see `lora.py`), and
`base_policy()` lends the module with its adapters off to a colocated reference.
"""
from __future__ import annotations

import json
import os
import time

import torch

from hybridflow.core.batch import Batch
from hybridflow.core.columns import ROLLOUT_LOG_PROBS
from hybridflow.core.metric_names import TRAINED_VERSION
from hybridflow.graph.dispatch import BROADCAST, DP, method
from hybridflow.graph.loss import current_keys, loss_slot, takes_loss
from hybridflow.workers.base import Worker, metrics_batch
from hybridflow.workers.config import ActorConfig, ModelConfig, RolloutConfig, read_section
from hybridflow.workers.lora import adapters_disabled, apply_lora, is_lora
from hybridflow.workers.loss_inputs import (PolicyOutputs, run_loss, select_for_loss,
                                            worker_default_loss)
from hybridflow.workers.mfu import FORWARD, TRAIN, phase_mfu, real_tokens
from hybridflow.workers.models import build_causal_lm, role_tp_mesh
from hybridflow.workers.rollout.engine import EngineSpec, check_engine_name, make_engine
from hybridflow.workers.rollout.generation import (GENERATE_WRITES, generate_rows, logprob_mismatch,
                                                   sampling_options)
from hybridflow.workers.rollout.weights import WEIGHT_KEYS, export_policy, refresh_engine
from hybridflow.workers.sequences import masked_mean, response_logprobs, training_mask_key
from hybridflow.workers.parallel.sequence_parallel import sequence_parallel
from hybridflow.workers.rollout.prepacked import prepacked_linears
from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
from hybridflow.workers.training import Trainer

__all__ = ["ActorWorker", "GENERATE_WRITES"]

VERSION_FILE = "policy_version.json"
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
        module = build_causal_lm(self.model_cfg, self.tokenizer, self.device, self.ctx.seed,
                                 tp_mesh=role_tp_mesh(self.ctx))  # tp>1: this rank's shard
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
        into the base when `merged`, else peft's adapter files only), gathered bucket by
        bucket into safetensors shards (`hf_export.py`). Every rank calls it (the
        gather is collective under FSDP2); rank 0 writes."""
        if self.lora and not merged:
            from hybridflow.workers.lora import save_adapter
            weights = self.trainer.backend.full_state_dict(self.module)  # small: adapters
            if self.ctx.rank == 0:
                save_adapter(self.module, directory, weights)
        else:
            from hybridflow.workers.hf_export import write_module
            base = self.module.get_base_model() if self.lora else self.module
            write_module(self.module, directory, self.ctx.rank, self._bucket_bytes(),
                         config=getattr(base, "config", None))
        if self.ctx.rank == 0:
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
        began = time.perf_counter()
        out = generate_rows(engine, batch, opts, sync_s)
        out.meta["metrics"].update(self._mfu(FORWARD, real_tokens(out), began))
        if not engine.shares_module:
            engine.sleep()  # colocated engine with its own copy: give training the memory
        return out

    def _mfu(self, flops_per_param_token: int, tokens: int, began: float) -> dict:
        """`perf/mfu` of a phase of this actor's model (workers/mfu.py)."""
        return phase_mfu(self.module, self.device, self.trainer.backend.compute_dtype,
                         flops_per_param_token, tokens, began)

    # ---------------------------------------------------------- weight export
    def _bucket_bytes(self) -> int:
        return max(1, int(self.rollout_cfg.weight_bucket_mb * 2**20))

    @method(dispatch=BROADCAST, reads=(), writes=WEIGHT_KEYS, kind="inference")
    def export_weights(self, batch: Batch) -> Batch:
        """The current policy for a rollout on another pool (the weight-sync edge):
        one row holding the weights' buckets and the policy version. Every rank runs it
        (the gather is collective when sharded); rank 0's export is kept."""
        export = export_policy(self.module, self.policy_version, self._bucket_bytes(),
                               rank=self.ctx.rank,
                               world_size=self.ctx.world_size if self.trainer.fsdp else 1,
                               current_version=lambda: self.policy_version)
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
            from hybridflow.core.loading import read_json
            record = read_json(path, "checkpoint policy version", dict)
            self.policy_version = int(record.get("policy_version", 0))

    # ---------------------------------------------------------------- logprob
    @method(dispatch=DP, reads=LOGPROB_READS, writes=("old_log_probs",), kind="inference",
            optional=("response_mask", "loss_mask", "rollout_log_probs"))
    def logprob(self, batch: Batch, micro_batch_size: int | None = None,
                with_entropy: bool = False, temperature: float | None = None,
                max_tokens_per_micro_batch: int | None = None) -> Batch:
        """Log-prob of each response token under the current weights, [B, R] float32."""
        mbs = micro_batch_size or self.rollout_cfg.log_prob_micro_batch_size
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        began = time.perf_counter()
        # the update's compute dtype: first ratios are 1; rows split over sp ranks
        with self.trainer.autocast(), sequence_parallel(self.module, self.ctx), \
                prepacked_linears(self.module, enabled=self._prepacks()):
            logp, ent = response_logprobs(
                self.module, batch, mbs, self.device, temp, with_entropy,
                max_tokens_per_micro_batch or self.rollout_cfg.log_prob_max_tokens_per_micro_batch,
                packed=self.model_cfg.use_remove_padding,
                logprob_chunk=self.actor_cfg.logprob_chunk)
        return metrics_batch(Batch({"old_log_probs": logp}),
                             {**_logprob_metrics(batch, logp, ent), **self._mfu(
                                 FORWARD, real_tokens(batch), began)})

    def _prepacks(self) -> bool:
        """`actor.prepacked_linear`, where the pass computes in its weights' fp32: under
        bf16 autocast the packed kernel would bypass the cast (and bf16 already runs
        through oneDNN)."""
        return self.actor_cfg.prepacked_linear and not torch.is_autocast_enabled("cpu")

    # ----------------------------------------------------------------- update
    @classmethod
    def optimizer_steps(cls, cfg, method: str, kwargs: dict, rows: int) -> int | None:
        """`update`: epochs x mini-batches (`actor.ppo_epochs` unless the call passes
        `epochs`; `actor.mini_batch_size` rows each)."""
        if method != "update":
            return None
        actor = read_section(cfg, "actor", ActorConfig)
        epochs = kwargs.get("epochs") or actor.ppo_epochs
        return epochs * -(-max(1, rows) // actor.mini_batch_size)

    @classmethod
    def input_sources(cls, cfg, method: str) -> dict[str, str]:
        """`update` with `actor.old_log_probs=rollout`: the old log-probs are the
        engine's `rollout_log_probs`."""
        rollout = read_section(cfg, "actor", ActorConfig).old_log_probs == "rollout"
        return {"old_log_probs": ROLLOUT_LOG_PROBS} if method == "update" and rollout else {}

    @takes_loss(model_reads=POLICY_INPUTS, current={"old_log_probs": "log_probs"})
    @method(dispatch=DP, reads=UPDATE_READS, writes=(), kind="train",
            optional=("ref_log_prob", "loss_mask", "rollout_log_probs"))
    def update(self, batch: Batch, temperature: float | None = None, loss=None,
               epochs: int | None = None, from_current=()) -> Batch:
        """Epochs over mini-batches (one optimizer step each) of micro-batches, minimising
        `loss(micro, out)` (the graph's; by default the one registered for actor.update,
        chosen from the actor config). `epochs` defaults to `actor.ppo_epochs`.
        The loss's mask (`out.mask`) and token counts are the batch's training mask:
        `loss_mask` in an agent batch (model tokens only), else `response_mask`.
        `from_current=("old_log_probs",)`: the loss's old log-probs are the detached
        log-probs of this forward (the compiler's plan/unneeded.py, when the update
        makes one optimizer step); more than one step is then refused."""
        cfg, began = self.actor_cfg, time.perf_counter()
        loss = loss if loss is not None else worker_default_loss(self, "actor.update", cfg)
        temp = self.rollout_cfg.temperature if temperature is None else temperature
        mask_key = training_mask_key(batch)
        inputs = POLICY_INPUTS + ((mask_key,) if mask_key not in POLICY_INPUTS else ())
        batch = _old_from_rollout(batch) if cfg.old_log_probs == "rollout" else batch
        slot = loss_slot(ActorWorker.update)
        own = current_keys(slot, {slot.current_param: from_current})
        current = {key: output for key, output in slot.current if key in own}
        data = select_for_loss(batch, inputs, loss, "actor.update", computed=own)
        packed = self.model_cfg.use_remove_padding

        def trainer_loss(model, micro: Batch, tokens, seqs):
            return run_loss(loss, micro, PolicyOutputs(model, micro, tokens, seqs, mask_key,
                                                       temperature=temp, packed=packed,
                                                       policy_version=self.policy_version,
                                                       logprob_chunk=cfg.logprob_chunk),
                            current)

        epochs = cfg.ppo_epochs if epochs is None else epochs
        metrics = self.trainer.train(data, trainer_loss, mask_key=mask_key, epochs=epochs,
                                     mini_batch_size=cfg.mini_batch_size,
                                     micro_batch_size=cfg.micro_batch_size,
                                     max_tokens=cfg.max_tokens_per_micro_batch, packed=packed,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed,
                                     one_step=f"actor.update({', '.join(own)} from its own "
                                              f"forward)" if own else None)
        # the version these weights had before this update: with the batch's
        # `policy_version`, how stale its samples were (async/staleness/*)
        metrics[TRAINED_VERSION] = float(self.policy_version)
        mfu = self._mfu(TRAIN * epochs, real_tokens(data), began)
        self.policy_version += 1  # what every later generated row is stamped with
        return metrics_batch(Batch(), {**{f"actor/{k}": v for k, v in metrics.items()}, **mfu})

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
            return run_loss(loss, micro, PolicyOutputs(model, micro, tokens, seqs,
                                                       policy_version=self.policy_version,
                                                       logprob_chunk=cfg.logprob_chunk))

        metrics = self.trainer.train(data, trainer_loss, epochs=epochs,
                                     mini_batch_size=mini_batch_size or cfg.mini_batch_size,
                                     micro_batch_size=micro_batch_size or cfg.micro_batch_size,
                                     shuffle=cfg.shuffle, seed=self.ctx.seed)
        return metrics_batch(Batch(), {f"actor/{k}": v for k, v in metrics.items()})


def _old_from_rollout(batch: Batch) -> Batch:
    """`batch` with `old_log_probs` = the engine's `rollout_log_probs`
    (`actor.old_log_probs=rollout`); KeyError naming the setting without them."""
    if not len(batch):
        return batch
    if ROLLOUT_LOG_PROBS not in batch:
        raise KeyError(f"actor.update: actor.old_log_probs=rollout takes the old log-probs "
                       f"from {ROLLOUT_LOG_PROBS!r}, which its input lacks: pass the generate "
                       f"node to the update, or set actor.old_log_probs=recompute")
    out = batch.select(*batch.keys())
    out["old_log_probs"] = batch[ROLLOUT_LOG_PROBS].float()
    return out


def _logprob_metrics(batch: Batch, logp, entropy) -> dict:
    """`actor/entropy` and the engine-vs-trainer `rollout/probs_diff_*` over the
    batch's training mask (an agent batch's model tokens; the observations were not
    sampled, so their probabilities say nothing)."""
    if not len(batch) or "response_mask" not in batch:
        return {}
    mask = batch[training_mask_key(batch)].cpu()
    metrics = {}
    if entropy is not None:
        metrics["actor/entropy"] = float(masked_mean(entropy, mask))
    if "rollout_log_probs" in batch:  # engine vs trainer
        metrics.update(logprob_mismatch(batch["rollout_log_probs"], logp, mask))
    return metrics
