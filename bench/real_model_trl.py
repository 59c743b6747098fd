"""hybridflow's GRPO step against TRL 1.16's GRPOTrainer on a real pretrained model
(SmolLM2-135M-Instruct) and the word_arith task, alternated round by round in one
process, at matched settings.

TRL lives in a venv of its own (`$TRL_VENV`, a folder you choose) that reuses the
engine venv's torch and transformers through a `.pth` file (bench/scale_trl.py; `torch`
must stay 2.13.0+cpu). From the checkout, with the model made into
`$HYBRIDFLOW_SMOLLM2_DIR` and the data into data/word_arith (docs/real_model.md):

    python -m venv $TRL_VENV
    ENGINE_SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    TRL_SITE=$($TRL_VENV/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    echo "$ENGINE_SITE" > "$TRL_SITE/main.pth"
    $TRL_VENV/bin/pip install trl==1.16.0 datasets
    # the measurement (quiet machine; ~25 min at ~30 s a step each side):
    PYTHONPATH=. $TRL_VENV/bin/python bench/real_model_trl.py \\
        --model $HYBRIDFLOW_SMOLLM2_DIR --data data/word_arith --reps 5 --threads 2
    # development: --reps 1 --warmup 0 --prompts 2 --n 2 --max-new-tokens 8

One round = one engine step (`graphs/grpo.py --config graphs/configs/smollm2_arith.yaml`:
generate, `actor.logprob`, reward, advantages, `actor.update`) and one TRL generation
with its optimizer steps; each side's seconds exclude the other's. Matched: the
model (from the same directory; fp32, or with `--dtype bf16` bf16 on both sides: the
engine's `model.dtype=bf16` (bf16 weights, fp32 master weights, autocast), TRL's bf16
model with `bf16=True`), the prompts (the data file's rows in order,
chat template with the generation prompt; `data.shuffle=false`, TRL's
`shuffle_dataset=False`), `n` responses per prompt, up to `max_new_tokens` each at
temperature 1 (HF `generate` both sides), one PPO epoch, mini-batches of
`actor.mini_batch_size` rows (TRL: `gradient_accumulation_steps` micro-batches of
`actor.micro_batch_size`, `steps_per_generation` = rows / micro, so TRL also takes the
old log-probs in a separate no-grad pass), token-mean loss ("dapo"), clip 0.2, lr,
AdamW, grad clip, no KL, the same reward (`algorithms/rewards/gsm8k.py`, flexible
extraction, on the decoded response without special tokens), torch threads. What
differs: responses are sampled, so the two sides generate different tokens (the
JSON has each side's generated tokens a round); the engine's log-prob pass takes
micro-batches of `rollout.log_prob_micro_batch_size` (16 in the shipped config),
TRL's of `per_device_train_batch_size` (8).

`--engine vllm` runs the engine with `rollout.backend=vllm`; `--trl-vllm` gives TRL
`use_vllm=True, vllm_mode="colocate"` (needs vllm importable: a venv on top of the
vLLM one, docs/benchmarks.md). Prints a table, writes bench/results/real_model_trl.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.engine_step import EngineStep  # noqa: E402
from bench.harness import (machine, median, need_real_model, quiet_logs, set_threads,  # noqa: E402
                             table, write_results)
from bench.scale_trl import alternate_with_trl, grpo_config, trl_available  # noqa: E402

CONFIG = os.path.join(ROOT, "graphs", "configs", "smollm2_arith.yaml")
TARGET_OVER_TRL = 1.6  # issue 37

__all__ = ["settings", "engine_overrides", "trl_rows", "run", "report", "main"]


def settings(args) -> dict:
    """The shapes both sides run with; mini/micro default to the shipped config's."""
    from omegaconf import OmegaConf
    shipped = OmegaConf.load(CONFIG)
    rows = args.prompts * args.n
    mini = min(args.mini or shipped.actor.mini_batch_size, rows)
    micro = min(args.micro or shipped.actor.micro_batch_size, mini)
    if rows % mini or mini % micro:
        raise SystemExit(f"--prompts x --n ({rows}) must be a multiple of the mini-batch "
                         f"({mini}), and it of the micro-batch ({micro})")
    return {"model": args.model, "data": args.data, "prompts": args.prompts, "n": args.n,
            "max_new_tokens": args.max_new_tokens, "mini": mini, "micro": micro,
            "lr": float(shipped.actor.lr), "threads": args.threads, "engine": args.engine,
            "trl_vllm": args.trl_vllm, "dtype": args.dtype, "overrides": list(args.overrides)}


def engine_overrides(s: dict) -> list[str]:
    rows = s["prompts"] * s["n"]
    out = [f"model.path={s['model']}", f"data.train_files={s['data']}/train.jsonl",
           f"data.val_files={s['data']}/test.jsonl", "data.shuffle=false",
           f"data.batch_size={s['prompts']}", f"rollout.n={s['n']}",
           f"rollout.max_new_tokens={s['max_new_tokens']}", f"rollout.micro_batch_size={rows}",
           f"rollout.log_prob_micro_batch_size={min(rows, 16)}",
           f"actor.mini_batch_size={s['mini']}", f"actor.micro_batch_size={s['micro']}",
           "trainer.val_every=0", "trainer.progress=false", "trainer.log_val_generations=0",
           f"runtime.torch_threads={s['threads']}",
           # both sides at one dtype (the shipped config says auto): fp32, or bf16 (the
           # engine: bf16 weights, fp32 master weights in the trainer, autocast)
           f"model.dtype={'bf16' if s.get('dtype') == 'bf16' else 'float32'}"]
    if s["engine"] == "vllm":
        out += ["rollout.backend=vllm"]
    return out + list(s.get("overrides", ()))


def trl_rows(path: str) -> list[dict]:
    """The train file's rows as TRL's conversational dataset: the chat messages as
    `prompt`, and the columns the reward reads."""
    with open(path) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [{"prompt": r["prompt"], "ground_truth": str(r["reward_model"]["ground_truth"]),
             "data_source": r["data_source"]} for r in rows]


def flexible_reward(prompts, completions, ground_truth, data_source, **_):
    """The engine's reward: the GSM8K scorer with flexible extraction."""
    from hybridflow.algorithms.rewards.gsm8k import compute_score
    return [compute_score(ds, c[-1]["content"] if isinstance(c, list) else c, gt,
                          method="flexible")
            for c, gt, ds in zip(completions, ground_truth, data_source)]


def _count_generated(model, eos_id: int, counts: list[int]) -> None:
    """Wrap `model.generate` to count the tokens each call generates (up to and with
    the first eos of each row)."""
    original = model.generate

    def generate(*args, **kwargs):
        out = original(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        counts.append(int(_lengths(out[:, ids.shape[1]:], eos_id).sum()))
        return out
    model.generate = generate


def _lengths(response: torch.Tensor, eos_id: int) -> torch.Tensor:
    is_eos = response == eos_id
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1,
                        torch.full((response.shape[0],), response.shape[1]))
    return first


def trl_trainer(s: dict, steps: int, callback, counts: list[int]):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    tok = AutoTokenizer.from_pretrained(s["model"])
    tok.padding_side = "left"
    bf16 = s.get("dtype") == "bf16"  # TRL's usual bf16 run: a bf16 model, bf16=True
    model = AutoModelForCausalLM.from_pretrained(
        s["model"], dtype=torch.bfloat16 if bf16 else torch.float32)
    _count_generated(model, tok.eos_token_id, counts)
    rows = s["prompts"] * s["n"]
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False} \
        if s["trl_vllm"] else {}
    args = grpo_config(
        "bench-real-trl-", per_device_train_batch_size=s["micro"],
        gradient_accumulation_steps=s["mini"] // s["micro"],
        steps_per_generation=rows // s["micro"], num_generations=s["n"],
        max_completion_length=s["max_new_tokens"], learning_rate=s["lr"], max_steps=steps,
        shuffle_dataset=False, bf16=bf16, **vllm)
    data = Dataset.from_list(trl_rows(os.path.join(s["data"], "train.jsonl")))
    return GRPOTrainer(model=model, reward_funcs=flexible_reward, args=args,
                       train_dataset=data, processing_class=tok, callbacks=[callback])


class CountedEngine:
    """An EngineStep that keeps each step's generated tokens and phases."""

    def __init__(self, s: dict):
        self.inner = EngineStep(engine_overrides(s), s["prompts"] * s["n"], yaml_file=CONFIG)
        self.results: list[dict] = []

    def step(self) -> None:
        result = self.inner.step()
        self.results.append({"phases_s": result["phases_s"],
                             "generated_tokens": result["generated_tokens"],
                             "score_mean": result["metrics"].get("critic/score/mean")})

    def close(self) -> None:
        self.inner.close()


def run(s: dict, reps: int, warmup: int, out: str | None = None, quiet: bool = False) -> dict:
    quiet_logs()
    set_threads(s["threads"])
    payload: dict = {"machine": machine(), "settings": s, "reps": reps, "warmup": warmup}
    name = f"hybridflow-{s['engine']}"
    engine = CountedEngine(s)
    counts: list[int] = []
    torch.manual_seed(0)
    optimizer_steps = s["prompts"] * s["n"] // s["mini"]
    times = alternate_with_trl(lambda steps, cb: trl_trainer(s, steps, cb, counts),
                               {name: engine}, reps, warmup, optimizer_steps)
    engine.close()
    kept = engine.results[warmup:]
    payload["samples"] = {"trl_step_s": times["trl_step_s"],
                          "engine_step_s": times[f"{name}_step_s"],
                          "trl_generated_tokens": counts[warmup:],
                          "engine": kept}
    trl_s, eng_s = median(times["trl_step_s"]), median(times[f"{name}_step_s"])
    phases = sorted({p for r in kept for p in r["phases_s"]})
    payload["engine"] = {"name": name, "step_s": eng_s,
                         "generated_tokens": median([r["generated_tokens"] for r in kept]),
                         "phases_s": {p: median([r["phases_s"].get(p, 0.0) for r in kept])
                                      for p in phases}}
    payload["trl"] = {"name": "trl-vllm" if s["trl_vllm"] else "trl-hf", "step_s": trl_s,
                      "generated_tokens": median([float(c) for c in counts[warmup:]])}
    ratio = trl_s / eng_s  # steps/s of the engine over TRL's
    payload["ratio_steps_per_s"] = ratio
    payload["target"] = {"over_trl": TARGET_OVER_TRL, "met": ratio >= TARGET_OVER_TRL}
    payload["load_avg_1m_at_end"] = os.getloadavg()[0]
    path = write_results("real_model_trl", payload, out)
    if not quiet:
        print(report(payload))
        print(f"wrote {path}")
    return payload


def report(p: dict) -> str:
    m, s, e, t = p["machine"], p["settings"], p["engine"], p["trl"]
    head = (f"machine: {m['cpu']}, {m['cores']} cores, torch threads {s['threads']}, load "
            f"{m['load_avg_1m_at_start']} -> {p['load_avg_1m_at_end']:.2f}\n"
            f"{s.get('dtype', 'fp32')}, {s['prompts']} prompts x {s['n']} responses "
            f"<= {s['max_new_tokens']} tokens, "
            f"mini-batch {s['mini']}, micro {s['micro']}, lr {s['lr']}; median of "
            f"{p['reps']} alternated rounds after {p['warmup']}")
    rows = [[e["name"], e["step_s"], 1 / e["step_s"], e["generated_tokens"]],
            [t["name"], t["step_s"], 1 / t["step_s"], t["generated_tokens"]]]
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in e["phases_s"].items())
    return "\n".join([head, table(["side", "step s", "steps/s", "generated tokens"], rows),
                      f"{e['name']} phases: {phases}",
                      f"{e['name']} / {t['name']} steps/s: {p['ratio_steps_per_s']:.2f}x "
                      f"(target >= {TARGET_OVER_TRL}x: "
                      f"{'met' if p['target']['met'] else 'not met'})"])




def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("HYBRIDFLOW_SMOLLM2_DIR"))
    parser.add_argument("--data", default=None, help="a folder with train.jsonl, test.jsonl "
                        "(`hybridflow data word_arith --out DIR`)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--mini", type=int, default=0, help="0: the shipped config's")
    parser.add_argument("--micro", type=int, default=0, help="0: the shipped config's")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--trl-vllm", action="store_true",
                        help='TRL with use_vllm=True, vllm_mode="colocate"')
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="both sides' compute dtype (bf16: where it is native)")
    parser.add_argument("--out", default=None)
    parser.add_argument("overrides", nargs="*", help="key=value for the engine's run, e.g. "
                        "rollout.enforce_eager=false (TRL's vLLM compiles: it sets no "
                        "enforce_eager)")
    args = parser.parse_args(argv)
    need_real_model(parser, args.model, args.data, data_needed=True)
    if not trl_available():
        parser.error("trl is not importable here: run this with a TRL venv's python "
                     "(see this file's docstring)")
    run(settings(args), args.reps, args.warmup, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
