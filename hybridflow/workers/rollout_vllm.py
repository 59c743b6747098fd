"""Rollout through vLLM (GPU only, the `vllm` extra). NOT YET RUN IN THIS PROJECT:
no GPU with vLLM was available; the pure-Python parts below are tested on CPU.

Written against vLLM's documented offline API (`LLM`, `SamplingParams`,
`TokensPrompt`, `LLM.sleep(level)`, `LLM.wake_up(tags)`, the model's `load_weights`
iterator of (name, tensor)). Colocated with the actor, each `generate` runs:

    wake_up(tags=["weights"])    weights back on the GPU (KV cache still freed)
    load_weights(training ones)  the actor's current weights, names mapped
    wake_up(tags=["kv_cache"])   only now reserve the KV cache
    generate
    sleep(level=1)               free the KV cache and offload weights for training

so the training state and the KV cache are never on the GPU at the same time.
"""
from __future__ import annotations

import tempfile
import time

import torch

from hybridflow.batch import Batch
from hybridflow.workers.rollout_hf import assemble_rollout
from hybridflow.workers.sequences import pad_right

__all__ = ["VLLMRollout", "prompt_token_lists", "sampling_kwargs", "responses_from_outputs",
           "vllm_weight_name", "vllm_weights", "COLOCATED_STEPS", "run_steps"]

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "base_model.model.")
COLOCATED_STEPS = ("wake_weights", "load_weights", "wake_kv_cache", "generate", "sleep")


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError("rollout.backend='vllm' needs vLLM on a CUDA machine: "
                          "pip install 'hybridflow[vllm]' (or use rollout.backend='hf')") from err
    return vllm


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompt rows -> their token ids without padding."""
    return [ids[m.bool()].tolist() for ids, m in zip(input_ids.cpu(), attention_mask.cpu())]


def sampling_kwargs(opts, eos_token_id) -> dict:
    """SamplingParams kwargs for one sample per (already repeated) prompt row."""
    eos = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    common = {"n": 1, "max_tokens": opts.max_new_tokens, "stop_token_ids": eos,
              "detokenize": False, "skip_special_tokens": False}
    if not opts.do_sample:
        return {**common, "temperature": 0.0, "top_p": 1.0, "top_k": -1}
    return {**common, "temperature": opts.temperature, "top_p": opts.top_p,
            "top_k": opts.top_k if opts.top_k > 0 else -1}


def responses_from_outputs(outputs, width: int, pad_id: int) -> torch.Tensor:
    """vLLM RequestOutputs (one per row, in order) -> [B, width] right-padded ids."""
    rows = [torch.tensor(list(o.outputs[0].token_ids)[:width], dtype=torch.long)
            for o in outputs]
    if not rows:
        return torch.zeros(0, width, dtype=torch.long)
    padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=pad_id)
    return pad_right(padded, width, pad_id)


def vllm_weight_name(name: str) -> str | None:
    """HF training parameter name -> the checkpoint name vLLM's `load_weights` expects
    (None: not a weight vLLM loads, e.g. an unmerged LoRA factor)."""
    if "lora_" in name:
        return None
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, changed = name[len(prefix):], True
    return name.replace(".base_layer.", ".").replace("._orig_mod.", ".")


def vllm_weights(state_dict: dict[str, torch.Tensor]):
    """(vLLM name, tensor) pairs; rotary caches and other buffers are skipped."""
    for name, tensor in state_dict.items():
        mapped = vllm_weight_name(name)
        if mapped is None or "rotary_emb" in mapped:
            continue
        yield mapped, tensor


def run_steps(engine, steps, *, weights=None, prompts=None, params=None):
    """Run the sleep/wake sequence on `engine` (an `LLM`); returns generate's outputs."""
    outputs = None
    for step in steps:
        if step == "wake_weights":
            engine.wake_up(tags=["weights"])
        elif step == "load_weights":
            engine.apply_model(lambda model: model.load_weights(weights))
        elif step == "wake_kv_cache":
            engine.wake_up(tags=["kv_cache"])
        elif step == "generate":
            outputs = engine.generate(prompts, params, use_tqdm=False)
        elif step == "sleep":
            engine.sleep(level=1)
        else:
            raise ValueError(f"unknown vLLM step {step!r}")
    return outputs


class VLLMRollout:
    """A vLLM engine colocated with the actor (one per rank, tensor parallel 1)."""

    def __init__(self, model_cfg, rollout_cfg, tokenizer, ctx):
        vllm = _import_vllm()
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend='vllm' needs a CUDA device")
        self.cfg, self.tokenizer, self.last_sync_s = rollout_cfg, tokenizer, 0.0
        path = model_cfg.path
        if path is None:  # built from a config: give vLLM a directory holding it
            path = tempfile.mkdtemp(prefix="hybridflow_vllm_")
            from transformers import AutoConfig
            values = dict(model_cfg.hf_config)
            AutoConfig.for_model(values.pop("model_type", "llama"),
                                 vocab_size=len(tokenizer), **values).save_pretrained(path)
            tokenizer.save_pretrained(path)
        self.engine = vllm.LLM(model=path, dtype=model_cfg.dtype, load_format="dummy",
                               gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
                               enable_sleep_mode=rollout_cfg.enable_sleep_mode,
                               enable_prefix_caching=True, seed=ctx.seed + ctx.rank)
        self.steps = COLOCATED_STEPS if rollout_cfg.enable_sleep_mode else \
            ("load_weights", "generate")
        if rollout_cfg.enable_sleep_mode:
            self.engine.sleep(level=1)
        self._pending = None

    def sync_weights(self, source: torch.nn.Module) -> float:
        """Remember the weights to load; they go in at the next generate's wake-up."""
        from hybridflow.workers.training import full_state_dict
        start = time.perf_counter()
        from hybridflow.workers.lora import is_lora, merged_state_dict
        sharded = any(hasattr(p, "full_tensor") for p in source.parameters())
        if is_lora(source):  # vLLM gets W + scaled B·A under the base names
            self._pending = merged_state_dict(source)
        else:
            self._pending = full_state_dict(source) if sharded else source.state_dict()
        self.last_sync_s = time.perf_counter() - start
        return self.last_sync_s

    def generate(self, prompts: Batch, opts) -> Batch:
        vllm = _import_vllm()
        from vllm.inputs import TokensPrompt
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        rows = [TokensPrompt(prompt_token_ids=ids) for ids in
                prompt_token_lists(prompts["input_ids"], prompts["attention_mask"])]
        params = vllm.SamplingParams(**sampling_kwargs(opts, eos))
        weights = list(vllm_weights(self._pending or {}))
        outputs = run_steps(self.engine, self.steps, weights=weights, prompts=rows,
                            params=params) if rows else []
        responses = responses_from_outputs(outputs, opts.max_new_tokens, pad)
        return assemble_rollout(prompts, responses, pad, eos)
