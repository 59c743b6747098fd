"""The ranks of a tensor-parallel vLLM engine for tests/workers/test_vllm_tp_real.py: each
spawned process is one rank of a gloo world, builds the `vllm` engine at tp=2 on the toy
model (4 heads, 2 KV heads, head size 32) and runs one scenario, writing its results to
`<out>/rank<r>.pt`. Here, not in a test module, so the spawned processes import it by
its full name."""
from __future__ import annotations

import os

import torch

TOY = os.path.join(os.path.dirname(__file__), "..", "..", "graphs", "assets", "toy_base")
PROMPTS = ["1+2=", "10+20=", "7*8=", "99-1="]
WIDTH = 10
BUCKET = 4096  # bytes: q/k/v of one layer land in different buckets


def toy_cfg(**rollout) -> dict:
    from tests.support.vllm_real import VLLM_ROLLOUT
    from tests.support.workers import make_cfg
    cfg = make_cfg()
    cfg["model"] = {"path": os.path.abspath(TOY), "device": "cpu", "dtype": "fp32"}
    cfg["rollout"] = {**VLLM_ROLLOUT, "max_new_tokens": WIDTH, "max_model_len": 128,
                      **rollout}
    return cfg


def new_weights(model_cfg, tokenizer, seed: int) -> dict:
    """The toy's weights moved by `nudge(seed)`: the policy after an update."""
    from hybridflow.workers.models import build_causal_lm
    from hybridflow.workers.rollout.weights import policy_weights
    from tests.support.vllm_real import nudge
    module = build_causal_lm(model_cfg, tokenizer, "cpu", 0)
    nudge(module, seed=seed, scale=0.05)
    return policy_weights(module)


def sync(engine, weights: dict, version: int) -> None:
    """Bucket by bucket, as the weight-sync edge loads them."""
    bucket, size = [], 0
    for name, tensor in weights.items():
        if bucket and size + tensor.nbytes > BUCKET:
            engine.load_weights(bucket)
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.nbytes
    engine.load_weights(bucket)
    engine.finish_weight_update(version)


def _columns(out, *keys) -> dict:
    return {k: out[k].clone() for k in keys}


def scenario(engine, tokenizer, rollout_cfg, model_cfg) -> dict:
    """Greedy before and after a weight sync, a sampled generate, and a greedy stream
    with a weight update landing while its requests are in flight."""
    from hybridflow.workers.rollout.generation import sampling_options
    from tests.support.workers import prompt_batch
    rows = prompt_batch(tokenizer, PROMPTS)
    prompts = rows.select("input_ids", "attention_mask")
    greedy = sampling_options(rollout_cfg, n=1, do_sample=False, max_new_tokens=WIDTH)
    keys = ("responses", "response_mask", "rollout_log_probs")
    out = {"v0": _columns(engine.generate(prompts, greedy), *keys)}
    sync(engine, new_weights(model_cfg, tokenizer, seed=1), version=1)
    out["v1"] = _columns(engine.generate(prompts, greedy), *keys)
    sampled = sampling_options(rollout_cfg, n=1, temperature=1.0, max_new_tokens=WIDTH)
    out["sampled"] = _columns(engine.generate(prompts.repeat(2, interleave=True), sampled),
                              *keys)
    engine.submit(rows, greedy)
    rows = [engine.poll(3)]
    sync(engine, new_weights(model_cfg, tokenizer, seed=2), version=2)
    while engine.stream_busy:
        rows.append(engine.poll(2))
    from hybridflow.core.batch import Batch
    stream = Batch.concat([r for r in rows if r is not None])
    out["stream"] = _columns(stream, *keys, "token_versions")
    out["stream_uid"] = [str(u) for u in stream["uid"]]
    return out


def refused_rows(engine, tokenizer, rollout_cfg, rank: int) -> str | None:
    """Each rank asked to generate a row of its own (what a layout that splits rows
    inside a tp group would do): the error the group raises before vLLM runs, or None."""
    from hybridflow.workers.rollout.generation import sampling_options
    from tests.support.workers import prompt_batch
    rows = prompt_batch(tokenizer, PROMPTS[rank:rank + 1]).select("input_ids", "attention_mask")
    try:
        engine.generate(rows, sampling_options(rollout_cfg, n=1, do_sample=False))
    except RuntimeError as err:
        return str(err)
    return None


def run_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    from hybridflow.core.context import WorkerContext
    from hybridflow.workers.config import ModelConfig, RolloutConfig, read_section
    from hybridflow.workers.rollout.engine import EngineSpec, make_engine
    from hybridflow.workers.tokenizer import load_tokenizer, tokenizer_spec
    cfg = toy_cfg()
    model_cfg = read_section(cfg, "model", ModelConfig)
    rollout_cfg = read_section(cfg, "rollout", RolloutConfig)
    tokenizer = load_tokenizer(tokenizer_spec(model_cfg))
    ctx = WorkerContext(rank=rank, world_size=world, local_rank=rank, device="cpu", seed=0)
    engine = make_engine(EngineSpec(model_cfg, rollout_cfg, tokenizer, ctx,
                                    torch.device("cpu"), tp=world))
    result = scenario(engine, tokenizer, rollout_cfg, model_cfg)
    result["refused"] = refused_rows(engine, tokenizer, rollout_cfg, rank)
    from vllm.distributed import get_tp_group
    group = get_tp_group()  # vLLM's own view of the group it runs in
    result["seed"], result["tp"] = engine.seed, engine.tp
    result["vllm_tp"] = (group.world_size, group.rank_in_group, list(group.ranks))
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
