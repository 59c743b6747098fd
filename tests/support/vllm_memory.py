"""The ranks of tests/memory/test_vllm_memory_real.py: each spawned process is one rank
of a gloo world that builds the `vllm` engine at tp=`world` on a model directory (as
a rollout on its own pool does), generates once, and writes its resident set size
(psutil) after the build and after the generate to `<out>/rank<r>.json`. Here, not in a
test module, so the spawned processes import it by its full name."""
from __future__ import annotations

import json
import os

PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1="]


def rss() -> int:
    import psutil
    return int(psutil.Process().memory_info().rss)


def rss_parts() -> dict:
    """This process's resident set by kind (/proc/self/status): anonymous, file-backed
    (mapped files: libraries, a checkpoint read through mmap) and shared memory."""
    parts = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("RssAnon", "RssFile", "RssShmem")):
                key, value = line.split(":")
                parts[key] = int(value.split()[0]) * 1024
    return parts


def engine_cfg(model_dir: str, kv_cache_gib: float, width: int = 16) -> dict:
    """The config both the ranks and the prediction read (`model`, `rollout`)."""
    return {"model": {"path": model_dir, "device": "cpu", "dtype": "fp32",
                      "tokenizer": "auto"},
            "rollout": {"backend": "vllm", "kv_cache_gib": kv_cache_gib,
                        "enforce_eager": True, "max_new_tokens": width,
                        "max_model_len": 256}}


def run_rank(rank: int, world: int, port: int, model_dir: str, kv_cache_gib: float,
             out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch
    torch.set_num_threads(1)
    from hybridflow.core.context import WorkerContext
    from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
    from hybridflow.workers.rollout.engine import EngineSpec, make_engine
    from hybridflow.workers.rollout.generation import sampling_options
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    from tests.support.workers import prompt_batch
    cfg = engine_cfg(model_dir, kv_cache_gib)
    model_cfg = read_section(cfg, "model", ModelConfig)
    rollout_cfg = read_section(cfg, "rollout", RolloutConfig)
    tokenizer = load_tokenizer(tokenizer_spec(model_cfg))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", seed=0)
    before = rss()
    engine = make_engine(EngineSpec(model_cfg, rollout_cfg, tokenizer, ctx,
                                    torch.device("cpu"), tp=world))
    built = rss()
    prompts = prompt_batch(tokenizer, PROMPTS).select("input_ids", "attention_mask")
    out = engine.generate(prompts.repeat(4, interleave=True),
                          sampling_options(rollout_cfg, n=1, temperature=1.0))
    result = {"before": before, "built": built, "generated": rss(),
              "tokens": int(out["response_mask"].sum()), "tp": engine.tp,
              "parts": rss_parts()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
