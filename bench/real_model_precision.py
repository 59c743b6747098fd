"""bf16 autocast against fp32 for the update and log-prob passes of a real pretrained
model (SmolLM2-135M-Instruct), with fp32 master weights in both (what `model.dtype=
bfloat16` does: hybridflow/workers/backends/base.py `autocast()`).

    python bench/real_model_precision.py --model $HYBRIDFLOW_SMOLLM2_DIR --threads 2

The batch is the shipped config's: `--rows` responses of `--prompt` + `--response`
tokens. Update: forward + backward of a token-mean log-prob loss (no optimizer
step: AdamW's cost is the same in both, it runs on the fp32 master weights).
Log-prob: a no-grad forward and the log-softmax gather. The variants alternate
`--reps` times after a warm-up; ratios are taken in the same run. Also reports the
largest log-prob difference bf16 makes. Prints a table, writes
bench/results/real_model_precision.json.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.harness import (alternate, machine, median, need_real_model, set_threads, table,
                             write_results)


def log_probs(model, ids, mask):
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def make_pass(model, ids, mask, kind: str, bf16: bool):
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else nullcontext

    def run():
        if kind == "update":
            model.zero_grad(set_to_none=True)
            with ctx():
                lp = log_probs(model, ids, mask)
            (-(lp * mask[:, 1:]).sum() / mask[:, 1:].sum()).backward()
        else:
            with torch.no_grad(), ctx():
                log_probs(model, ids, mask)
    return run


def matmul_probe(reps: int = 10) -> dict[str, float]:
    """Seconds per matmul of one MLP projection's shape in fp32 and bf16: whether this
    CPU has bf16 kernels at all (without AVX-512 bf16 / AMX, bf16 is emulated)."""
    import time
    a, b = torch.randn(864, 576), torch.randn(576, 1536)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), b.to(dtype)
        x @ y
        start = time.perf_counter()
        for _ in range(reps):
            x @ y
        out[str(dtype).split(".")[-1]] = (time.perf_counter() - start) / reps
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=60)
    parser.add_argument("--response", type=int, default=48)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    need_real_model(parser, args.model)
    set_threads(args.threads)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    torch.manual_seed(0)
    width = args.prompt + args.response
    ids = torch.randint(3, model.config.vocab_size, (args.rows, width))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        fp32 = log_probs(model, ids, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = log_probs(model, ids, mask)
    drift = float((fp32 - bf16).abs().max())
    variants = {f"{kind} {name}": make_pass(model, ids, mask, kind, name == "bf16")
                for kind in ("update", "logprob") for name in ("fp32", "bf16")}
    matmul = matmul_probe()
    times = alternate(variants, args.reps, warmup=1)
    rows = []
    for kind in ("update", "logprob"):
        fp, bf = median(times[f"{kind} fp32"]), median(times[f"{kind} bf16"])
        rows.append([kind, fp, bf, fp / bf])
    print(table(["pass", "fp32 s", "bf16 s", "bf16 speed-up"], rows))
    print(f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}; one "
          f"864x576 @ 576x1536 matmul: fp32 {matmul['float32'] * 1e3:.1f} ms, "
          f"bf16 {matmul['bfloat16'] * 1e3:.1f} ms")
    print(f"largest |log-prob fp32 - bf16|: {drift:.3f} nats "
          f"({args.rows} rows x {width} tokens)")
    path = write_results("real_model_precision", {
        "machine": machine(), "args": vars(args), "times_s": times, "max_logprob_drift": drift,
        "matmul_probe_s": matmul,
        "load_avg_1m_at_end": os.getloadavg()[0],
        "rows": [dict(zip(("pass", "fp32_s", "bf16_s", "speedup"), r)) for r in rows]},
        args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
