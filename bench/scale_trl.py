"""TRL's GRPOTrainer on bench/scale.py's workload, alternated with the engine.

TRL is not a dependency of the engine's venv; install it beside it (torch and
transformers are reused, not reinstalled):

    python -m venv $TRL_VENV            # a folder you choose
    # the engine venv's site-packages on the TRL venv's path, from the checkout:
    ENGINE_SITE=$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    TRL_SITE=$($TRL_VENV/bin/python -c "import sysconfig; print(sysconfig.get_path('purelib'))")
    echo "$ENGINE_SITE" > "$TRL_SITE/main.pth"
    $TRL_VENV/bin/pip install trl==1.16.0 datasets
    PYTHONPATH=. $TRL_VENV/bin/python bench/scale.py --trl

Matched settings: the same Qwen2 model built from the workload config (same seed),
the same prompts (char tokenizer), `num_generations = n`, one generation of
`prompts x n` completions per optimizer step (`per_device_train_batch_size` = the
engine's micro-batch rows, `gradient_accumulation_steps` = rows / micro), the same
generate (`sample_responses`'s length processor is injected into the model's
`generate`, so completions have the engine's k-th step lengths), lr 1e-6, clip 0.2,
token-mean ("dapo") loss, std-scaled group advantages, no KL (beta 0), grad clip
1.0, AdamW, CPU, float32, the same crc32 reward. What still differs: with one
generation per optimizer step TRL takes the old log-probs from the update's own
forward (it skips the separate no-grad pass the engine's `actor.logprob` makes),
and TRL logs per-token entropy only when asked (off here, on in the engine).
"""
from __future__ import annotations

import tempfile
import time

import torch

from bench import workload
from bench.scale_loop import LengthStop, compute_score

__all__ = ["trl_available", "run_trl", "grpo_config", "alternate_with_trl"]


def trl_available() -> bool:
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
        return True
    except ImportError:
        return False


def _length_sampled_generate(model, max_response: int, eos_id: int, first_seed: int):
    """Wrap `model.generate` so call k ends its rows at the lengths of seed
    `first_seed + k` (the engines' generate calls so far: the same lengths as the
    engine steps it alternates with)."""
    from transformers import LogitsProcessorList
    original, calls = model.generate, [first_seed]

    def generate(*args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        stop = LengthStop(len(ids), max_response, ids.shape[1], eos_id, seed=calls[0])
        calls[0] += 1
        kwargs["logits_processor"] = LogitsProcessorList([stop])
        return original(*args, **kwargs)
    model.generate = generate


def grpo_config(prefix: str, **settings):
    """TRL's GRPOConfig with what every side-by-side here matches the engine on (CPU,
    float32, sampling at temperature 1 with no top-p/top-k, AdamW as the engine's,
    constant lr, grad clip 1.0, clip 0.2, token-mean ("dapo") loss, std-scaled group
    advantages, no KL, one PPO epoch, no logging), plus the `settings` of one bench
    (batch shape, lengths, lr, steps)."""
    from trl import GRPOConfig
    matched = dict(
        output_dir=tempfile.mkdtemp(prefix=prefix), use_cpu=True, report_to="none",
        temperature=1.0, top_p=1.0, top_k=0, weight_decay=0.01, adam_beta1=0.9,
        adam_beta2=0.999, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        beta=0.0, epsilon=0.2, num_iterations=1, loss_type="dapo", scale_rewards="group",
        save_strategy="no", logging_steps=10_000, seed=0, remove_unused_columns=False,
        dataloader_num_workers=0, bf16=False, disable_tqdm=True, log_completions=False)
    return GRPOConfig(**{**matched, **settings})


def trl_trainer(s: dict, texts: list[str], steps: int, callback, first_seed: int = 0):
    from datasets import Dataset
    from trl import GRPOTrainer

    from hybridflow.workers.tokenizer import load_tokenizer
    tok = load_tokenizer("char")
    tok.padding_side = "left"
    rows = s["prompts"] * s["n"]
    model = workload.make_model(s["size"])
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    _length_sampled_generate(model, s["max_response"], tok.eos_token_id, first_seed)

    def reward(prompts, completions, **_):
        return [compute_score("scale", c, "0") for c in completions]

    args = grpo_config(
        "bench-scale-trl-", per_device_train_batch_size=s["micro"],
        gradient_accumulation_steps=rows // s["micro"], num_generations=s["n"],
        max_completion_length=s["max_response"], learning_rate=1e-6, max_steps=steps)
    data = Dataset.from_list([{"prompt": t} for t in texts])
    return GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                       processing_class=tok, callbacks=[callback])


def alternate_with_trl(make_trainer, engines: dict, reps: int, warmup: int,
                       optimizer_steps: int = 1) -> dict:
    """Run TRL's trainer (`make_trainer(total_optimizer_steps, callback)`) for warmup +
    reps rounds of `optimizer_steps` optimizer steps (one generation's worth); after
    each round, one step of every engine in `engines` (not counted in TRL's time).
    Returns each side's seconds per round, the warm-up rounds dropped."""
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        def __init__(self):
            self.mark, self.trl_steps, self.done = None, [], 0
            self.engine_steps = {name: [] for name in engines}

        def on_train_begin(self, args, state, control, **kw):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.done += 1
            if self.done % optimizer_steps:
                return
            self.trl_steps.append(time.perf_counter() - self.mark)
            i = len(self.trl_steps) - 1
            print(f"  round {i} trl            {self.trl_steps[-1]:7.2f} s", flush=True)
            for name, engine in engines.items():
                start = time.perf_counter()
                engine.step()
                self.engine_steps[name].append(time.perf_counter() - start)
                print(f"  round {i} {name:14s} {self.engine_steps[name][-1]:7.2f} s",
                      flush=True)
            self.mark = time.perf_counter()

    callback = Alternate()
    make_trainer(optimizer_steps * (warmup + reps), callback).train()
    return {"trl_step_s": callback.trl_steps[warmup:],
            **{f"{name}_step_s": ts[warmup:] for name, ts in callback.engine_steps.items()}}


def run_trl(s: dict, texts: list[str], engines: dict, reps: int, warmup: int) -> dict:
    """TRL for warmup + reps optimizer steps (one generation each); after each, one
    step of every engine in `engines` (not counted in TRL's time)."""
    torch.manual_seed(0)
    first_seed = min(getattr(e, "generate_calls", 0) for e in engines.values()) \
        if engines else 0
    return alternate_with_trl(
        lambda steps, callback: trl_trainer(s, texts, steps, callback, first_seed),
        engines, reps, warmup)
