"""The `vllm` rollout engine (GPU only, the `vllm` extra). NOT YET RUN IN THIS PROJECT:
no GPU with vLLM was available. Written against vLLM 0.10.2-0.11 (the `vllm` extra
pins that range); the pure-Python parts are tested on CPU against a fake `LLM` that
refuses what vLLM's multiprocess executor cannot serialise.

One engine per rank, in the rank's own process:
- `distributed_executor_backend="external_launcher"` with the rank's distributed env
  (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, set by the runtime), as TRL's
  colocate mode does: each rank's engine sits on the rank's own GPU (vLLM's default
  executor would start a worker process per engine, all on GPU 0), and the engine
  core runs in this process, so weights reach the model by `apply_model` on the
  model object itself, with nothing serialised.
- A model built from a config gets `architectures` (else vLLM takes it for an
  embedding model) and an explicit `max_model_len`.
- Weights arrive bucket by bucket (`load_weights`, one `apply_model` each, tensors
  moved to the GPU per bucket); `finish_weight_update` then resets the prefix cache:
  prefix caching is on, and a prompt sharing a prefix would otherwise reuse KV
  computed with the old weights.
- Colocated with the actor (`spec.module` given), the engine sleeps at level 2
  after each generate (weights and KV cache freed: the next generate reloads the
  weights anyway), so training never shares the GPU with it. On its own pool it
  keeps its weights between the syncs.
- `rollout_log_probs` come from `SamplingParams(logprobs=0)` (the sampled token's
  log-prob) with `logprobs_mode="processed_logprobs"` (after temperature), so they
  compare with the trainer's log-probs at the same temperature.

State: `llm` (the vLLM engine), `policy_version` (of the weights it holds;
UNKNOWN_VERSION while asleep at level 2 or still holding dummy weights), `asleep`.
"""
from __future__ import annotations

import functools
import os
import tempfile
from typing import Iterable

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION, EngineSpec
from hybridflow.workers.rollout.generation import assemble_rollout
from hybridflow.workers.sequences import pad_right

__all__ = ["VLLMEngine", "make_vllm_engine", "engine_kwargs", "prompt_token_lists",
           "sampling_kwargs", "responses_from_outputs", "log_probs_from_outputs",
           "load_into_model", "causal_lm_architecture", "SLEEP_LEVEL"]

SLEEP_LEVEL = 2


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError("rollout.backend='vllm' needs vLLM on a CUDA machine: "
                          "pip install 'hybridflow[vllm]' (or use rollout.backend='hf')") from err
    return vllm


def causal_lm_architecture(model_type: str) -> str:
    """The Hugging Face causal-LM class name for a model type (`LlamaForCausalLM`)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if name is None:
        raise ValueError(f"model.hf_config model_type {model_type!r} has no causal-LM class "
                         "in transformers, so vLLM cannot build it")
    return name


def model_directory(model_cfg, tokenizer) -> str:
    """A directory vLLM can open: `model.path`, or the config (with `architectures`)
    and tokenizer of a model built from `model.hf_config`, written to a temp dir."""
    if model_cfg.path is not None:
        return model_cfg.path
    from transformers import AutoConfig
    values = dict(model_cfg.hf_config)
    model_type = values.pop("model_type", "llama")
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), **values)
    config.architectures = [causal_lm_architecture(model_type)]
    path = tempfile.mkdtemp(prefix="hybridflow_vllm_")
    config.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def max_model_len(model_cfg, rollout_cfg) -> int:
    if rollout_cfg.max_model_len > 0:
        return rollout_cfg.max_model_len
    if model_cfg.path is None:
        return int(model_cfg.hf_config.get("max_position_embeddings", 2048))
    from transformers import AutoConfig
    return int(getattr(AutoConfig.from_pretrained(model_cfg.path), "max_position_embeddings",
                       2048))


def engine_kwargs(spec: EngineSpec, path: str) -> dict:
    """`vllm.LLM(**kwargs)` for this rank: in-process, on the rank's own GPU."""
    cfg = spec.rollout_cfg
    return {"model": path, "dtype": spec.model_cfg.dtype, "tensor_parallel_size": 1,
            "distributed_executor_backend": "external_launcher",
            "load_format": "dummy" if spec.module is not None or spec.model_cfg.path is None
            else "auto",
            "max_model_len": max_model_len(spec.model_cfg, cfg),
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enable_sleep_mode": cfg.enable_sleep_mode and spec.module is not None,
            "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs",
            "seed": spec.ctx.seed + spec.ctx.rank}


def _rank_env(ctx, device) -> None:
    """external_launcher reads the torch.distributed env; a test or a one-rank run
    may not have set it."""
    os.environ.setdefault("RANK", str(ctx.rank))
    os.environ.setdefault("WORLD_SIZE", str(ctx.world_size))
    os.environ.setdefault("LOCAL_RANK", str(device.index or 0))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")


def make_vllm_engine(spec: EngineSpec, llm_class=None, sampling_params=None) -> "VLLMEngine":
    """`llm_class` and `sampling_params` replace `vllm.LLM` and `vllm.SamplingParams`
    (tests pass fakes)."""
    if llm_class is None:
        vllm = _import_vllm()
        llm_class, sampling_params = vllm.LLM, vllm.SamplingParams
        if not torch.cuda.is_available():
            raise RuntimeError("rollout.backend='vllm' needs a CUDA device")
    path = model_directory(spec.model_cfg, spec.tokenizer)
    _rank_env(spec.ctx, spec.device)
    kwargs = engine_kwargs(spec, path)
    engine = VLLMEngine(llm_class(**kwargs), sampling_params, spec.tokenizer, spec.device,
                        sleep_mode=kwargs["enable_sleep_mode"])
    if kwargs["load_format"] == "auto":
        engine.policy_version = 0  # the checkpoint at model.path is the initial policy
    elif spec.module is None:  # own weights, built from a config: the seeded initial policy
        from hybridflow.workers.models import build_causal_lm
        from hybridflow.workers.rollout.weights import policy_weights
        initial = build_causal_lm(spec.model_cfg, spec.tokenizer, "cpu", spec.ctx.seed)
        engine.load_weights(policy_weights(initial).items())
        engine.finish_weight_update(0)
    if engine.sleep_mode:
        engine.sleep()
    return engine


def load_into_model(model, weights: list) -> int:
    """Runs inside vLLM, on the model: a module-level function (not a lambda or a
    closure), so it would also pickle for a multiprocess executor."""
    model.load_weights(weights=iter(weights))
    return len(weights)


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Left-padded prompt rows -> their token ids without padding."""
    return [ids[m.bool()].tolist() for ids, m in zip(input_ids.cpu(), attention_mask.cpu())]


def sampling_kwargs(opts, eos_token_id) -> dict:
    """SamplingParams kwargs for one sample per (already repeated) prompt row, with the
    sampled token's log-prob (`logprobs=0`)."""
    eos = eos_token_id if isinstance(eos_token_id, list) else [eos_token_id]
    common = {"n": 1, "max_tokens": opts.max_new_tokens, "stop_token_ids": eos,
              "detokenize": False, "skip_special_tokens": False, "logprobs": 0}
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


def log_probs_from_outputs(outputs, width: int) -> torch.Tensor:
    """The sampled tokens' log-probs [B, width] (0 past each response's end): vLLM
    gives, per generated token, a dict token id -> Logprob holding the sampled one."""
    out = torch.zeros(len(outputs), width, dtype=torch.float32)
    for row, request in enumerate(outputs):
        sample = request.outputs[0]
        for col, (token, ranked) in enumerate(zip(sample.token_ids, sample.logprobs or [])):
            if col >= width:
                break
            out[row, col] = float(ranked[token].logprob)
    return out


class VLLMEngine:
    shares_module = False  # vLLM holds its own copy of the weights

    def __init__(self, llm, sampling_params, tokenizer, device, sleep_mode: bool):
        self.llm, self.sampling_params = llm, sampling_params
        self.tokenizer, self.device, self.sleep_mode = tokenizer, device, sleep_mode
        self.policy_version = UNKNOWN_VERSION
        self.asleep = False

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True
            self.policy_version = UNKNOWN_VERSION  # level 2 discarded the weights

    def wake_up(self) -> None:
        """Weights only: the KV cache is reserved after they are loaded (generate)."""
        if self.asleep:
            self.llm.wake_up(tags=["weights"])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.wake_up()
        bucket = [(name, tensor.to(self.device, non_blocking=True)) for name, tensor in weights]
        self.llm.apply_model(functools.partial(load_into_model, weights=bucket))

    def finish_weight_update(self, version: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the sync is timed to the real load
        self.llm.reset_prefix_cache()
        self.policy_version = version

    def generate(self, prompts: Batch, opts) -> Batch:
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = opts.max_new_tokens
        rows = [{"prompt_token_ids": ids} for ids in
                prompt_token_lists(prompts["input_ids"], prompts["attention_mask"])]
        outputs = []
        if rows:
            if self.asleep:
                self.llm.wake_up(tags=["kv_cache"])
                self.asleep = False
            params = self.sampling_params(**sampling_kwargs(opts, eos))
            outputs = self.llm.generate(rows, params, use_tqdm=False)
        responses = responses_from_outputs(outputs, width, pad)
        return assemble_rollout(prompts, responses, pad, eos,
                                log_probs_from_outputs(outputs, width))
