"""One GPU, five minutes, torch + transformers only: a ~0.5B Qwen2-architecture model
(Qwen2.5-0.5B's shapes, built from a config in bf16, random weights, no download)
generates, scores log-probs and takes an update step on the realistic workload's
lengths (bench/workload.py), printing tokens/s per phase and the peak memory of each
phase (`torch.cuda.max_memory_allocated`) against `hybridflow.memory`'s prediction.

It has not run yet (no GPU where it was written). Without CUDA it stops at once;
its log-prob and update passes are exercised on the CPU by tests/bench.

    python bench/gpu.py                    # 64 prompts x 4 samples, responses <= 512
    python bench/gpu.py --prompts 32 --max-response 256 --micro 8
    python bench/gpu.py --max-tokens 0     # row micro-batches instead of a token budget
    python bench/gpu.py --packed           # packed sequences (model.use_remove_padding)
    python bench/gpu.py --vllm DIR         # the vLLM engine's GPU-only paths on model DIR

    python bench/gpu.py --tp 2            # tp=1 vs tp=2 through the workers (torchrun, NCCL)
    python bench/gpu.py --tp 3 --model DIR  # a model whose heads and KV heads 3 divides

`--tp N` (UNRUN on a GPU: written on a CPU-only machine) is `bench/parallel.py --workers`
on the device: tp=1 and tp=N alternated (`--reps`), each a `torchrun --standalone
--nproc-per-node` of ranks that build an `ActorWorker` with `WorkerContext(tp=world,
device=cuda)` (NCCL), then time `rollout.generate` (the hf engine on the sharded
actor), `actor.logprob`, `actor.update` and the split-pool weight sync (send: every rank
gathers each bucket, rank 0 stages it on the host; receive: rank 0 loads it into a
tp=1 hf engine), with each phase's `torch.cuda.max_memory_allocated` per rank. The model
is `--model DIR`, or Qwen2.5-0.5B's shapes (14 heads, 2 KV heads: tp 1 or 2) in bf16,
random weights. `--device cpu` runs the same ranks on gloo with RSS peaks (what
tests/bench/test_gpu_tp_bench.py runs: the launching, the phases and the table).

`--vllm DIR` (needs `pip install -e ".[vllm]"`; UNRUN: written on a CPU-only machine)
runs `bench/vllm_engine.gpu_checks`: sleep level 2 with the layerwise reload (memory
after sleep, log-probs vs the trainer's after an update), CUDA graphs against eager
(tokens/s, same greedy tokens), the weight sync's time on the device. NCCL weight
broadcast is not written (the sync edge moves weights as Ray objects).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import workload
from bench.workload import QWEN2_05B  # the model this bench builds

GIB = 1024 ** 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-prompt", type=int, default=256)
    parser.add_argument("--max-response", type=int, default=512)
    parser.add_argument("--micro", type=int, default=16, help="rows per log-prob/update "
                        "forward")
    parser.add_argument("--gen-micro", type=int, default=256, help="rows per generate call")
    parser.add_argument("--max-tokens", type=int, default=8192,
                        help="token budget per log-prob/update micro-batch (verl's "
                             "use_dynamic_bsz; 0: --micro rows)")
    parser.add_argument("--packed", action="store_true",
                        help="packed sequences (model.use_remove_padding)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vllm", metavar="MODEL_DIR", default=None,
                        help="run the vLLM engine's GPU checks on this HF model directory")
    parser.add_argument("--tp", type=int, default=0, help="tp=1 vs tp=N through the workers "
                        "under torchrun (bench/gpu_tp.py)")
    parser.add_argument("--model", default=None, help="--tp: an HF model directory (default: "
                        "Qwen2.5-0.5B's shapes, random weights)")
    parser.add_argument("--reps", type=int, default=2, help="--tp: alternated runs")
    parser.add_argument("--new-tokens", type=int, default=128, help="--tp: max_new_tokens")
    parser.add_argument("--prompt-copies", type=int, default=8,
                        help="--tp: the 4 prompts, this many times over")
    parser.add_argument("--bucket-mb", type=float, default=256.0,
                        help="--tp: rollout.weight_bucket_mb")
    parser.add_argument("--shapes", default=None, help=argparse.SUPPRESS)  # tests: tiny
    parser.add_argument("--out", default=None, help="--tp: the JSON's path")
    parser.add_argument("--tp-child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def build(device):
    from transformers import AutoConfig, AutoModelForCausalLM
    values = dict(QWEN2_05B)
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model, config


def timed(fn, device):
    """(result, seconds, peak bytes above what was allocated before) of `fn()`."""
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(device)
    return out, time.perf_counter() - start, torch.cuda.max_memory_allocated(device) - before


def generate(model, args, device):
    from transformers import LogitsProcessorList
    prompts = workload.make_prompts(args.prompts, max_prompt=args.max_prompt)
    ids = prompts["input_ids"].repeat_interleave(args.n, 0)
    mask = prompts["attention_mask"].repeat_interleave(args.n, 0)
    outs = []
    for i in range(0, len(ids), args.gen_micro):
        sampler = workload.LengthSampler(len(ids[i:i + args.gen_micro]), args.max_response,
                                         seed=i, prompt_width=ids.shape[1])
        seqs = model.generate(input_ids=ids[i:i + args.gen_micro].to(device),
                              attention_mask=mask[i:i + args.gen_micro].to(device),
                              max_new_tokens=args.max_response, do_sample=True,
                              logits_processor=LogitsProcessorList([sampler]),
                              pad_token_id=workload.PAD_ID, eos_token_id=workload.EOS_ID)
        outs.append(seqs[:, ids.shape[1]:])
    return outs


def logprob_pass(model, batch, args, device):
    from hybridflow.workers.sequences import response_logprobs
    logp, _ = response_logprobs(model, batch, args.micro, device,
                                max_tokens=args.max_tokens or None, packed=args.packed)
    return logp


def update_step(model, optimizer, batch, args, device):
    """One AdamW step over the engine's micro-batches (rows or a token budget, trimmed
    to each micro-batch's longest row; packed when asked), token-mean loss."""
    from hybridflow.workers.micro_batches import micro_batches
    from hybridflow.workers.sequences import forward_response
    tokens = batch["response_mask"].sum().clamp(min=1).to(device)
    for micro in micro_batches(batch, args.micro, args.max_tokens or None, args.packed):
        part = micro.batch.to(device)
        logp, _ = forward_response(model, part, packed=args.packed)
        mask = part["response_mask"]
        loss = -(logp * part["advantages"] * mask).sum() / tokens
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def predictions(config, args, rows):
    from hybridflow.memory import MicroBatch, model_size, training_state
    from hybridflow.memory.passes import generate_pass, inference_pass, train_pass
    size = model_size(config, "causal", torch.bfloat16)
    from hybridflow.memory.roles import micro_rows
    micro = MicroBatch(micro_rows(rows, args.micro, args.max_tokens or None,
                                  args.max_prompt + args.max_response),
                       args.max_prompt, args.max_response)
    return size, {
        # plain HF generate here: no log-prob recorder (the engine's `hf` backend has one)
        "generate": sum(generate_pass(size, min(args.gen_micro, rows), args.max_prompt,
                                      args.max_response, records_logprobs=False).values()),
        "logprob": sum(inference_pass(size, micro).values()),
        "update": sum(train_pass(size, micro, cuda=True).values())
        + training_state(size)["optimizer"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tp_child:
        from bench.gpu_tp import child
        return child(args)
    if args.tp and args.device != "cpu" and not torch.cuda.is_available():
        print("bench/gpu.py --tp needs CUDA devices and torch sees none (--device cpu runs "
              "the same ranks on gloo)", file=sys.stderr)
        return 2
    if args.tp:
        from bench.gpu_tp import compare
        return compare(args, __file__)
    if not torch.cuda.is_available():
        print("bench/gpu.py needs a CUDA device and torch sees none; run it where a GPU "
              "is available (it needs only torch and transformers)", file=sys.stderr)
        return 2
    if args.vllm:
        import json

        from bench.vllm_engine import gpu_checks
        print(json.dumps(gpu_checks(args.vllm), indent=1))
        return 0
    device = torch.device(args.device)
    model, config = build(device)
    rows = args.prompts * args.n
    size, predicted = predictions(config, args, rows)
    print(f"model: {size.params / 1e6:.0f}M parameters, bf16, {torch.cuda.get_device_name()}")
    model.eval()
    with torch.no_grad():
        outs, gen_s, gen_peak = timed(lambda: generate(model, args, device), device)
    generated = sum(int((o != workload.PAD_ID).sum()) for o in outs)
    batch = workload.make_rollout(args.prompts, args.n, args.max_response, args.max_prompt)
    trained = int(batch["attention_mask"].sum())
    _, lp_s, lp_peak = timed(lambda: logprob_pass(model, batch, args, device), device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    update_step(model, optimizer, batch, args, device)  # allocates the moments
    _, up_s, up_peak = timed(lambda: update_step(model, optimizer, batch, args, device),
                             device)
    up_peak += torch.cuda.memory_allocated(device) - size.weight_bytes  # moments were there
    print(f"{'phase':<9} {'tokens/s':>10} {'peak GiB':>9} {'predicted GiB':>14}")
    for name, tokens, seconds, peak in (("generate", generated, gen_s, gen_peak),
                                        ("logprob", trained, lp_s, lp_peak),
                                        ("update", trained, up_s, up_peak)):
        print(f"{name:<9} {tokens / seconds:>10.0f} {peak / GIB:>9.2f} "
              f"{predicted[name] / GIB:>14.2f}")
    print("peaks are above the resident weights; update includes AdamW's moments")
    return 0


if __name__ == "__main__":
    sys.exit(main())
