"""Predicted against measured peak memory of the actor's and critic's passes.

For each configuration (model size, dtype, prompt/response lengths, micro-batch
rows, LoRA on/off, pass: update / logprob / generate, critic update / values) this
builds a real `ActorWorker` or `CriticWorker` on the benchmark workload
(`bench/workload.py`), runs the pass once to warm up (the optimizer allocates its
moments at the first step), then runs it again and measures its peak;
`hybridflow.memory.roles.actor_pass_memory` (or `critic_pass_memory`) predicts the
same figure from the config alone.

How the peak is measured:
- CPU: torch's profiler with `profile_memory=True` records every allocation and
  free of the CPU allocator (tensor storage, not Python objects or allocator
  slack). The peak is the tensors this configuration holds before the pass (found
  by walking the live tensors, shared storage once) plus the highest running sum of
  the pass's allocation events. RSS would add the allocator's caching and
  fragmentation, which the prediction does not model.
- CUDA (`--device cuda`): `torch.cuda.max_memory_allocated` after
  `reset_peak_memory_stats`, minus what was allocated before the configuration.

    python bench/memory.py                 # all configurations -> bench/results/memory.json
    python bench/memory.py --quick         # four small ones
    python bench/memory.py --device cuda   # the same comparison on a GPU
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import workload

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "memory.json")
MIB = 2 ** 20
TARGET = 0.15


@dataclass(frozen=True)
class Case:
    kind: str              # update | logprob | generate (actor); critic-update | values
    size: str = "5m"       # a bench/workload.py size
    rows: int = 8          # rows of the batch on the worker
    micro: int = 4         # rows per forward
    prompt: int = 64
    response: int = 128
    dtype: str = "float32"
    lora: int = 0          # LoRA rank (0: off)
    budget: int = 0        # tokens per micro-batch (`*max_tokens_per_micro_batch`; 0: rows)

    @property
    def name(self) -> str:
        lora = f" lora{self.lora}" if self.lora else ""
        budget = f" tok{self.budget}" if self.budget else ""
        return (f"{self.kind} {self.size} {self.dtype} rows{self.rows} mb{self.micro} "
                f"P{self.prompt} R{self.response}{lora}{budget}")


CASES = (
    # update: sizes, lengths, micro-batches, LoRA, dtype
    Case("update", "5m", 8, 4, 64, 64),
    Case("update", "5m", 8, 4, 64, 128),
    Case("update", "5m", 8, 2, 64, 256),
    Case("update", "5m", 16, 8, 32, 128),
    Case("update", "5m", 8, 1, 64, 128),
    Case("update", "10m", 8, 4, 64, 128),
    Case("update", "10m", 8, 2, 64, 256),
    Case("update", "28m", 8, 2, 64, 128),
    Case("update", "28m", 4, 1, 64, 256),
    Case("update", "5m", 8, 4, 64, 128, lora=8),
    Case("update", "10m", 8, 4, 64, 128, lora=16),
    Case("update", "28m", 8, 2, 64, 128, lora=8),
    Case("update", "5m", 8, 4, 64, 128, dtype="bfloat16"),
    Case("update", "10m", 8, 2, 64, 64, dtype="bfloat16", lora=8),
    # log-probs (no gradient)
    Case("logprob", "5m", 8, 4, 64, 128),
    Case("logprob", "10m", 16, 8, 64, 256),
    Case("logprob", "28m", 8, 8, 64, 128),
    Case("logprob", "10m", 8, 4, 64, 128, dtype="bfloat16"),
    # generate: the KV cache
    Case("generate", "5m", 16, 16, 64, 128),
    Case("generate", "10m", 32, 32, 64, 256),
    Case("generate", "28m", 16, 8, 64, 192),
    Case("generate", "10m", 16, 16, 32, 128, dtype="bfloat16"),
    # the critic: a value head, no vocab-wide logits
    Case("critic-update", "10m", 8, 4, 64, 128),
    Case("critic-update", "28m", 8, 2, 64, 256),
    Case("values", "10m", 16, 8, 64, 128),
    # token budgets: the budget, not the row count, sizes the micro-batch
    Case("update", "5m", 16, 16, 64, 128, budget=768),
    Case("logprob", "10m", 16, 16, 64, 256, budget=1280),
    Case("critic-update", "10m", 8, 8, 64, 128, budget=384),
)
QUICK = (CASES[0], CASES[9], CASES[14], CASES[18])


def run_config(case: Case, device: str) -> dict:
    lora = {"rank": case.lora, "alpha": 2 * max(case.lora, 1)}
    budget = case.budget or None
    return {"model": {"hf_config": workload.hf_config(case.size), "dtype": case.dtype,
                      "device": device},
            "actor": {"micro_batch_size": case.micro, "mini_batch_size": case.rows,
                      "lora": lora, "max_tokens_per_micro_batch": budget},
            "critic": {"micro_batch_size": case.micro, "mini_batch_size": case.rows,
                       "max_tokens_per_micro_batch": budget},
            "rollout": {"max_new_tokens": case.response, "micro_batch_size": case.micro,
                        "log_prob_micro_batch_size": case.micro, "n": 1,
                        "log_prob_max_tokens_per_micro_batch": budget},
            "data": {"max_prompt_length": case.prompt, "batch_size": case.rows}}


def predict(case: Case, device: str) -> dict:
    from hybridflow.memory.roles import actor_pass_memory, critic_pass_memory
    cuda = device.startswith("cuda")
    if case.kind in CRITIC_KINDS:
        return critic_pass_memory(run_config(case, device), CRITIC_KINDS[case.kind],
                                  rows=case.rows, cuda=cuda)
    return actor_pass_memory(run_config(case, device), case.kind, rows=case.rows, cuda=cuda)


CRITIC_KINDS = {"critic-update": "update", "values": "values"}


def _call(worker, case: Case, batch):
    if case.kind in CRITIC_KINDS:
        method = getattr(worker, CRITIC_KINDS[case.kind])
        return lambda: method(batch)
    if case.kind == "update":
        return lambda: worker.update(batch)
    if case.kind == "logprob":
        return lambda: worker.logprob(batch)
    return lambda: worker.generate(batch)


def _batch(case: Case):
    if case.kind == "generate":
        from hybridflow.core.batch import Batch
        prompts = workload.make_prompts(case.rows, min_prompt=case.prompt // 2,
                                        max_prompt=case.prompt)
        return Batch(prompts)
    return workload.make_rollout(case.rows // 4, 4, max_response=case.response,
                                 max_prompt=case.prompt)


def live_tensor_bytes() -> int:
    """Bytes of every CPU tensor alive in this process, shared storage once."""
    seen, total = set(), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not (isinstance(obj, torch.Tensor) and obj.device.type == "cpu"):
                    continue
                storage = obj.untyped_storage()
            except (RuntimeError, ReferenceError, NotImplementedError):
                continue
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def cpu_peak_of(fn) -> int:
    """The highest running sum of allocator events while `fn` runs (bytes above
    what was allocated when it started)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    current = peak = 0
    for _, nbytes in events:
        current += nbytes
        peak = max(peak, current)
    return peak


def measure(case: Case, device: str) -> int:
    """Peak bytes this configuration holds during its pass (second call)."""
    from hybridflow.workers.actor import ActorWorker
    from hybridflow.workers.critic import CriticWorker
    gc.collect()
    cuda = device.startswith("cuda")
    before = torch.cuda.memory_allocated() if cuda else live_tensor_bytes()
    role = CriticWorker if case.kind in CRITIC_KINDS else ActorWorker
    worker = role(run_config(case, device))
    batch = _batch(case)
    call = _call(worker, case, batch)
    call()  # warm-up: AdamW allocates its moments at the first step
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        call()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = live_tensor_bytes() - before + cpu_peak_of(call)
    del worker, batch, call
    gc.collect()
    return peak


def run(cases=CASES, device: str = "cpu", out: str | None = RESULTS,
        quiet: bool = False) -> dict:
    torch.set_num_threads(1)
    rows = []
    for case in cases:
        start = time.perf_counter()
        predicted = predict(case, device)
        measured = measure(case, device)
        total = sum(predicted.values())
        row = {**asdict(case), "name": case.name, "predicted_bytes": total,
               "measured_bytes": measured, "error": total / measured - 1,
               "breakdown": predicted, "seconds": time.perf_counter() - start}
        rows.append(row)
        if not quiet:
            print(f"{case.name:<48} predicted {total / MIB:8.1f} MiB  measured "
                  f"{measured / MIB:8.1f} MiB  {row['error']:+.1%}", flush=True)
    payload = summarize(rows, device)
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out, "w") as handle:
            json.dump(payload, handle, indent=1)
    return payload


def summarize(rows: list[dict], device: str) -> dict:
    """The JSON payload of measured rows: machine, method, rows, verdict."""
    return {"machine": {"device": device, "torch": torch.__version__,
                        "transformers": _version("transformers")},
            "method": "cpu: profiler allocation events + live tensors before; "
                      "cuda: torch.cuda.max_memory_allocated",
            "rows": rows, "target": TARGET,
            "worst_abs_error": max(abs(r["error"]) for r in rows),
            "within_target": sum(abs(r["error"]) <= TARGET for r in rows)}


def _version(name: str) -> str:
    try:
        return __import__(name).__version__
    except ImportError:
        return "-"


def report(payload: dict) -> str:
    lines = ["| configuration | predicted MiB | measured MiB | error |",
             "|---|---:|---:|---:|"]
    for r in payload["rows"]:
        lines.append(f"| {r['name']} | {r['predicted_bytes'] / MIB:.1f} | "
                     f"{r['measured_bytes'] / MIB:.1f} | {r['error']:+.1%} |")
    lines.append(f"\n{payload['within_target']}/{len(payload['rows'])} within "
                 f"±{payload['target']:.0%}; worst {payload['worst_abs_error']:.1%}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:<index>")
    parser.add_argument("--quick", action="store_true", help="four small configurations")
    parser.add_argument("--kinds", nargs="*", help="only these passes (e.g. update values)")
    parser.add_argument("--budgets", action="store_true",
                        help="only the token-budget configurations")
    parser.add_argument("--out", default=RESULTS, help="JSON results file")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA device; torch sees none here")
    cases = QUICK if args.quick else CASES
    if args.kinds:
        cases = tuple(c for c in cases if c.kind in args.kinds)
    if args.budgets:
        cases = tuple(c for c in cases if c.budget)
    payload = run(cases, args.device, args.out)
    print(report(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
