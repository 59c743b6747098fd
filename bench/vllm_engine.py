"""Rollout throughput of the `vllm` and `hf` engines through the project, the weight
sync per step, and the project's overhead over a bare `vllm.LLM.generate` on the same
prompts. Needs vLLM (the CPU build here: run it in the environment .ci/vllm.sh makes).

Models: the toy base (graphs/assets/toy_base) on the toy prompts and, when present,
a real pretrained model (`--real`, default `$HYBRIDFLOW_SMOLLM2_DIR`, SmolLM2-135M-
Instruct as a HF directory) on chat-formatted toy prompts. Per model, `--repeats`
rounds alternate the three ways (project vLLM, bare vLLM, project HF) on the same
prompt rows; each reports generated tokens / wall seconds. The weight sync is timed
by bumping the actor's policy version (the next generate reloads every weight in
`rollout.weight_bucket_mb` buckets). Torch threads are set (`--threads`).

    python bench/vllm_engine.py                      # both models
    python bench/vllm_engine.py --skip-real --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "bench", "results", "vllm_engine.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--toy", default=None, help="the toy model directory (default: "
                        "graphs/assets/toy_base)")
    parser.add_argument("--real", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR", ""))
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--out", default=RESULTS)
    return parser.parse_args(argv)


def workloads(args) -> list[dict]:
    from hybridflow.graphs.common import TOY_BASE
    out = [{"name": "toy_base", "path": args.toy or TOY_BASE, "prompts": 64, "n": 4, "tokens": 16,
            "chat": False}]
    if not args.skip_real and os.path.isfile(os.path.join(args.real, "config.json")):
        out.append({"name": os.path.basename(args.real.rstrip("/")), "path": args.real,
                    "prompts": 16, "n": 1, "tokens": 32, "chat": True})
    return out


def prompt_rows(tokenizer, count: int, chat: bool):
    """`count` arithmetic prompts (chat-formatted when `chat`) with the columns a
    rollout carries (uid, data_source, ground_truth). Built here, not with the tests'
    helpers: importing tests/support sets torch to 1 thread."""
    from hybridflow.core.batch import Batch
    pairs = list(zip(range(count), range(3, 3 + count)))
    texts = [f"{a}+{b}=" for a, b in pairs]
    if chat:
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": f"What is {t}?"}],
                                               tokenize=False, add_generation_prompt=True)
                 for t in texts]
    enc = tokenizer(texts, padding=True, return_tensors="pt", add_special_tokens=False)
    return Batch({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]},
                 {"uid": [f"u{i}" for i in range(count)], "data_source": ["toy_arith"] * count,
                  "ground_truth": [str(a + b) for a, b in pairs]})


def actor(path: str, backend: str, args, device="cpu", dtype="fp32", eager=True):
    from hybridflow.workers import ActorWorker
    cfg = {"model": {"path": path, "device": device, "dtype": dtype, "tokenizer": "auto"},
           "actor": {"lr": 1e-5, "mini_batch_size": 8, "micro_batch_size": 8},
           "rollout": {"backend": backend, "kv_cache_gib": args.kv_cache_gib,
                       "enforce_eager": eager, "micro_batch_size": 256},
           "critic": {}, "ref": {}, "reward": {}}
    return ActorWorker(cfg)


def timed_generate(worker, batch, w) -> tuple[float, int]:
    start = time.perf_counter()
    out = worker.generate(batch, n=w["n"], max_new_tokens=w["tokens"], temperature=1.0)
    return time.perf_counter() - start, int(out["response_length"].sum())


def timed_bare(worker, batch, w) -> tuple[float, int]:
    """`vllm.LLM.generate` itself on the same rows (repeated n times, as the project
    sends them) and sampling parameters: no assembly, no weight check."""
    from hybridflow.workers.rollout.generation import sampling_options
    from hybridflow.workers.rollout.vllm import prompt_token_lists, sampling_kwargs
    engine = worker.engine
    rows = batch.repeat(w["n"], interleave=True)
    prompts = [{"prompt_token_ids": ids} for ids in
               prompt_token_lists(rows["input_ids"], rows["attention_mask"])]
    opts = sampling_options(worker.rollout_cfg, max_new_tokens=w["tokens"], temperature=1.0)
    params = engine.sampling_params(**sampling_kwargs(opts, worker.tokenizer.eos_token_id))
    start = time.perf_counter()
    with engine.state.entered():  # keeps the trainer's process state (see vllm_process)
        outputs = engine.llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def weight_sync_s(worker, batch, w) -> float:
    """One sync of every weight (as after an update), timed as the actor reports it."""
    worker.policy_version += 1
    out = worker.generate(batch, n=1, max_new_tokens=1)
    return float(out.meta["metrics"]["rollout/weight_sync_s"])


def bench_model(w: dict, args) -> dict:
    vllm_actor, hf_actor = actor(w["path"], "vllm", args), actor(w["path"], "hf", args)
    batch = prompt_rows(vllm_actor.tokenizer, w["prompts"], w["chat"])
    start = time.perf_counter()
    timed_generate(vllm_actor, batch, w)  # builds the engine, first sync, warm-up
    build_s = time.perf_counter() - start
    timed_generate(hf_actor, batch, w)
    runs = {"project_vllm": [], "bare_vllm": [], "project_hf": []}
    for _ in range(args.repeats):  # alternated: load on the machine hits all three alike
        for key, fn, who in (("project_vllm", timed_generate, vllm_actor),
                             ("bare_vllm", timed_bare, vllm_actor),
                             ("project_hf", timed_generate, hf_actor)):
            seconds, tokens = fn(who, batch, w)
            runs[key].append({"s": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds})
    syncs = [weight_sync_s(vllm_actor, batch, w) for _ in range(args.repeats)]
    vllm_actor.engine.close()
    med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
    per_token = {k: statistics.median(r["s"] / max(r["tokens"], 1) for r in v)
                 for k, v in runs.items()}
    return {"model": w["name"], "workload": {k: w[k] for k in ("prompts", "n", "tokens")},
            "engine_build_s": build_s, "runs": runs, "median_tokens_per_s": med,
            "vllm_over_hf": med["project_vllm"] / med["project_hf"],
            "project_over_bare_s_per_token": per_token["project_vllm"] / per_token["bare_vllm"],
            "weight_sync_s": syncs, "weight_sync_median_s": statistics.median(syncs)}


def table(results: list[dict]) -> str:
    head = ("| model | rows x tokens | vLLM (project) tok/s | bare vLLM tok/s | HF tok/s | "
            "vLLM / HF | project / bare (s per token) | weight sync s |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        m, w = r["median_tokens_per_s"], r["workload"]
        lines.append(f"| {r['model']} | {w['prompts'] * w['n']} x {w['tokens']} | "
                     f"{m['project_vllm']:.0f} | {m['bare_vllm']:.0f} | {m['project_hf']:.0f} | "
                     f"{r['vllm_over_hf']:.2f}x | {r['project_over_bare_s_per_token']:.2f}x | "
                     f"{r['weight_sync_median_s']:.3f} |")
    return "\n".join(lines)


def gpu_checks(model_path: str, kv_cache_gib: float = 4.0) -> dict:
    """What only a GPU can show (bench/gpu.py --vllm runs it; UNRUN so far): each check
    returns its numbers, and a failed one raises naming what broke.
    - sleep level 2 + the layerwise reload: a colocated engine frees its memory after
      generate, and after an update its log-probs equal the trainer's (bf16: 1e-2);
    - CUDA graphs (enforce_eager=False) against eager: same greedy tokens, tokens/s;
    - the weight sync's time per step on the device (bucketed apply_model loads).
    NCCL weight broadcast is not written: the sync edge moves weights as Ray objects."""
    from tests.support.workers import rollout_for_update
    out = {}
    for eager in (True, False):
        worker = actor(model_path, "vllm", argparse.Namespace(kv_cache_gib=kv_cache_gib),
                       device="cuda", dtype="bf16", eager=eager)
        batch = prompt_rows(worker.tokenizer, 32, chat=False)
        w = {"n": 4, "tokens": 64}
        timed_generate(worker, batch, w)
        seconds, tokens = timed_generate(worker, batch, w)
        torch.cuda.synchronize()
        asleep_gib = torch.cuda.memory_allocated() / 2 ** 30
        worker.update(rollout_for_update(worker))
        rollout = worker.generate(batch, n=2)
        trainer = worker.logprob(rollout)["old_log_probs"] * rollout["response_mask"]
        diff = float((rollout["rollout_log_probs"] - trainer).abs().max())
        if diff > 1e-2:
            raise AssertionError(f"eager={eager}: after sleep/reload, log-probs differ by {diff}")
        greedy = worker.generate(batch, do_sample=False)["responses"]
        out["eager" if eager else "cuda_graphs"] = {
            "tokens_per_s": tokens / seconds, "allocated_gib_after_sleep": asleep_gib,
            "logprob_max_diff_after_update": diff, "sleep_mode": worker.engine.sleep_mode,
            "weight_sync_s": weight_sync_s(worker, batch, w), "greedy": greedy.tolist()}
        worker.engine.close()
    if out["eager"]["greedy"] != out["cuda_graphs"]["greedy"]:
        out["greedy_differs_with_cuda_graphs"] = True
    return out


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import vllm  # fails at once without vLLM, before any model loads
    results = [bench_model(w, args) for w in workloads(args)]
    print(table(results))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"threads": args.threads, "repeats": args.repeats,
                   "torch": torch.__version__, "vllm": vllm.__version__,
                   "results": results}, fh, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
