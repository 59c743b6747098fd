"""The `hf` rollout engine: Hugging Face `generate`, on CPU or GPU.

Given the actor's module (colocated), the engine *is* that module: after an update
the next `generate` already uses the new weights, with no copy, and the actor
stamps its own update count as the engine's `policy_version`. Without one (the
`rollout` role on a pool of its own), it builds its own copy from the `model`
section and `load_weights` copies buckets of the actor's exported weights into it.

The log-prob of each sampled token is taken step by step (`ChosenLogProbs`, the last
logits processor: it sees the scores sampled from) instead of asking `generate` for
`output_scores`, which keeps every step's float32 [rows, vocab] scores until the
end. `generate` stops once every row has ended (its stopping criteria).

On a tensor-parallel actor (`placement.parallel.actor.tp > 1`) the shared module is
sharded: every rank of a tp group receives the same rows and the same sampling seed
(one stream per data-parallel rank), runs `generate` in lockstep (each forward's
collectives), and samples from whole logits (`full_logits` gathers the head's
vocabulary shards), so the group draws identical tokens. Streaming is refused there.
A `rollout` role on a pool of its own at tp > 1 builds its own module the same way,
sharded over its tp group (`models.build_causal_lm(tp_mesh=...)`: shard by shard from
a safetensors directory), and `load_weights` copies each rank's part of every tensor.

State: `module` (shared or own), `policy_version` (of the weights in `module`), `tp`
(fixed when built), the stream loop (stream.py, built at the first submit).
"""
from __future__ import annotations

from typing import Iterable

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.parallel.tensor_parallel import full_logits, is_tensor_parallel
from hybridflow.workers.config import RolloutConfig
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION, EngineSpec
from hybridflow.workers.rollout.engine_stream import EngineStream
from hybridflow.workers.rollout.generation import assemble_rollout
from hybridflow.workers.rollout.hf_decode import decode
from hybridflow.workers.rollout.prepacked import prepacked_linears
from hybridflow.workers.parallel.shard_build import local_slices
from hybridflow.workers.sequences import pad_right, position_ids_from_mask

__all__ = ["HFEngine", "make_hf_engine", "sampled_log_probs", "ChosenLogProbs",
           "sampled_warpers"]


def make_hf_engine(spec: EngineSpec) -> "HFEngine":
    if spec.module is not None:  # a sharded module generates on its tp group, in lockstep
        tp = spec.group_tp if is_tensor_parallel(spec.module) else 1
        return HFEngine(spec.module, spec.tokenizer, spec.device, shares_module=True,
                        synced_gpus=spec.synced_gpus, seed=_stream_seed(spec.ctx), tp=tp)
    from hybridflow.workers.models import build_causal_lm, role_tp_mesh
    sharded = spec.group_tp > 1 and spec.group_tp == getattr(spec.ctx, "tp", 1)
    module = build_causal_lm(spec.model_cfg, spec.tokenizer, spec.device, spec.ctx.seed,
                             tp_mesh=role_tp_mesh(spec.ctx) if sharded else None)
    module.eval().requires_grad_(False)  # tp>1: this rank's shard, generating in lockstep
    return HFEngine(module, spec.tokenizer, spec.device, shares_module=False, version=0,
                    seed=_stream_seed(spec.ctx), tp=spec.group_tp if sharded else 1)


def _stream_seed(ctx) -> int:
    """The streaming sampler's seed: the run's, one stream per data-parallel rank."""
    rank = getattr(ctx, "dp_rank", getattr(ctx, "rank", 0))
    return int(getattr(ctx, "seed", 0) or 0) * 1000 + int(rank or 0)


class ChosenLogProbs:
    """A logits processor, last in the list: at each step it keeps the log-softmax of
    the processed scores, and at the next step (or `finish`, after `generate`) reads
    the token that was chosen from them. Holds one step's [rows, vocab] at a time."""

    def __init__(self):
        self.steps: list[torch.Tensor] = []
        self.pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.pending is not None:
            self._take(input_ids[:, -1])
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, tokens: torch.Tensor) -> None:
        chosen = torch.gather(self.pending, -1, tokens.unsqueeze(-1)).squeeze(-1)
        self.steps.append(torch.nan_to_num(chosen, neginf=0.0).cpu())  # after EOS: masked
        self.pending = None

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """[B, steps] float32, given the generated tokens [B, steps]."""
        if self.pending is not None:
            self._take(new_tokens[:, len(self.steps)].to(self.pending.device))
        if not self.steps:
            return torch.zeros(new_tokens.shape[0], 0)
        return torch.stack(self.steps, dim=1)


def sampled_warpers(opts: RolloutConfig) -> list:
    """HF's own sampling warpers for `opts`, in the order `generate` applies them."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    if not opts.do_sample:
        return []
    warpers = []
    if opts.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(opts.temperature))
    if opts.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=opts.top_k, min_tokens_to_keep=1))
    if opts.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=opts.top_p, min_tokens_to_keep=1))
    return warpers


def sampled_log_probs(scores: tuple, tokens: torch.Tensor) -> torch.Tensor:
    """Log-prob of each generated token under the processed scores it was sampled
    from (temperature, top-k and top-p applied), [B, steps] float32."""
    if not scores:
        return torch.zeros(tokens.shape[0], 0)
    steps = torch.stack(scores, dim=1).float()              # [B, steps, V]
    logp = torch.log_softmax(steps, dim=-1)
    chosen = torch.gather(logp, -1, tokens[:, :steps.shape[1]].unsqueeze(-1)).squeeze(-1)
    return torch.nan_to_num(chosen, neginf=0.0)              # tokens after EOS: masked later


class HFEngine(EngineStream):
    """A `StreamingEngine` (registered with streams=True: its stream is a `StreamLoop`,
    stream.py; poll, abort and the counters are engine_stream.py's). `tp`: the ranks
    generating together (a tensor-parallel module's group; 1 otherwise)."""

    def __init__(self, module: torch.nn.Module, tokenizer, device, shares_module: bool,
                 synced_gpus: bool = False, version: int = UNKNOWN_VERSION, seed: int = 0,
                 tp: int = 1):
        self.module, self.tokenizer, self.device = module, tokenizer, device
        self.shares_module = shares_module
        self.synced_gpus, self.tp = synced_gpus, tp
        self.policy_version = version
        self.seed, self._stream = seed, None

    # ------------------------------------------------------------- streaming
    def submit(self, prompts: Batch, opts: RolloutConfig) -> int:
        """Queue one request per row (rows repeated n times) in the continuous-batching
        loop (stream.py); returns how many."""
        if self.synced_gpus:
            raise RuntimeError("trainer.async_mode=streaming: the 'hf' engine of an FSDP "
                               "actor decodes in lockstep over ranks (synced_gpus) and "
                               "cannot stream; place the rollout on a pool of its own "
                               "(placement.roles.rollout=<pool>)")
        if is_tensor_parallel(self.module):
            raise RuntimeError("trainer.async_mode=streaming: the 'hf' engine of a "
                               "tensor-parallel actor (placement.parallel.actor.tp > 1) "
                               "decodes in lockstep over its tp group and cannot stream; use "
                               "trainer.async_mode=pipeline, or tp=1")
        return self._stream_for(opts).submit(prompts)

    def _open_stream(self, opts: RolloutConfig):
        from hybridflow.workers.rollout.stream import StreamLoop
        return StreamLoop(self.module, self.tokenizer, self.device, opts, self.seed,
                          sampled_warpers(opts))

    # ---------------------------------------------------------------- weights
    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = self.module.state_dict()
        for name, tensor in weights:
            if name not in params:
                raise KeyError(f"rollout engine 'hf' got weight {name!r}, which its model "
                               f"does not have (first of its names: {list(params)[:3]})")
            param = params[name]  # a tensor-parallel module's: this rank's part of it
            if tuple(tensor.shape) != tuple(param.shape):
                raise ValueError(f"rollout engine 'hf' got weight {name!r} of shape "
                                 f"{tuple(tensor.shape)}; its model's is {tuple(param.shape)}")
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(tensor[local_slices(param)].to(local.device, local.dtype))

    def finish_weight_update(self, version: int) -> None:
        self.policy_version = version

    def sleep(self) -> None:
        pass  # HF generate holds no cache between calls

    def wake_up(self) -> None:
        pass

    # --------------------------------------------------------------- generate
    def _generation_config(self, opts: RolloutConfig):
        from transformers import GenerationConfig
        # the warpers are passed as logits processors (`sampled_warpers`), ahead of the
        # log-prob recorder, so HF adds none of its own
        sample = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0} \
            if opts.do_sample else {"do_sample": False}
        return GenerationConfig(max_new_tokens=opts.max_new_tokens, min_new_tokens=0,
                                pad_token_id=self.tokenizer.pad_token_id,
                                eos_token_id=self.tokenizer.eos_token_id, use_cache=True,
                                return_dict_in_generate=True, **sample)

    @torch.no_grad()
    def generate(self, prompts: Batch, opts: RolloutConfig) -> Batch:
        """Rows of `prompts` already repeated n times; returns the engine columns."""
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = opts.max_new_tokens
        if len(prompts) == 0 and not self.synced_gpus:
            return assemble_rollout(prompts, torch.zeros(0, width, dtype=torch.long), pad, eos)
        was_training = self.module.training
        self.module.eval()
        config = self._generation_config(opts)
        try:
            with prepacked_linears(self.module, enabled=opts.prepacked_linear):
                outs, logps = self._micro_batches(prompts, opts, config, width)
        finally:
            self.module.train(was_training)
        responses = torch.cat(outs) if outs else torch.zeros(0, width, dtype=torch.long)
        log_probs = torch.cat(logps) if logps else None
        return assemble_rollout(prompts, responses, pad, eos, log_probs)

    def _micro_batches(self, prompts: Batch, opts: RolloutConfig, config,
                       width: int) -> tuple[list, list]:
        """(new tokens, their log-probs) of each micro-batch, padded to `width`."""
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        outs, logps = [], []
        for i in range(0, max(1, len(prompts)), opts.micro_batch_size):
            micro = prompts.take(slice(i, i + opts.micro_batch_size))
            ids, mask = micro["input_ids"], micro["attention_mask"]
            if len(micro) == 0:  # synced FSDP rank with no rows: decode a dummy row
                ids, mask = torch.full((1, 1), pad), torch.ones(1, 1, dtype=torch.long)
            if self._own_loop and opts.hf_loop == "own":
                new, logp = decode(self.module, ids.to(self.device), mask.to(self.device),
                                   width, _eos_list(eos), pad, sampled_warpers(opts),
                                   greedy=not opts.do_sample)
                new, logp = new.cpu(), logp.cpu()
            else:
                new, logp = self._hf_generate(ids, mask, config, opts)
            if len(micro):
                outs.append(pad_right(new, width, pad))
                logps.append(_pad_float(logp, width))
        return outs, logps

    @property
    def _own_loop(self) -> bool:
        """hf_decode's loop, except where ranks decode in lockstep (FSDP's synced_gpus,
        a tensor-parallel group): there HF `generate` keeps them in step."""
        return not self.synced_gpus and self.tp == 1 and not is_tensor_parallel(self.module)

    def _hf_generate(self, ids, mask, config, opts) -> tuple[torch.Tensor, torch.Tensor]:
        """HF `generate` on one micro-batch: (new tokens, their log-probs), on the CPU."""
        from transformers import LogitsProcessorList
        recorder = ChosenLogProbs()
        with full_logits(self.module):  # a tp head's logits whole, for sampling
            result = self.module.generate(
                input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                position_ids=position_ids_from_mask(mask).to(self.device),
                generation_config=config, synced_gpus=self.synced_gpus,
                logits_processor=LogitsProcessorList(sampled_warpers(opts) + [recorder]))
        new = result.sequences[:, ids.shape[1]:].cpu()
        return new, recorder.finish(new)


def _eos_list(eos) -> list[int]:
    return [int(e) for e in eos] if isinstance(eos, (list, tuple)) else [int(eos)]


def _pad_float(x: torch.Tensor, width: int) -> torch.Tensor:
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=0.0)
