"""Supervised fine-tuning: learn `prompt + answer + EOS` with the loss on the answer.

It also makes the embedded default's base model. Remake it with:

    hybridflow run graphs/sft.py trainer.run_name=toy_base model.hf_config.head_dim=32 \
        algorithm.stop_fraction=0.4
    hybridflow export runs/toy_base graphs/assets/toy_base   # then drop policy_version.json

(head size 32: vLLM's CPU attention takes 32, 64, ... but not the 16 that hidden 64 /
4 heads gives; with it the base needed stop_fraction 0.4, not 0.3, for GRPO to reach
held-out greedy 1.0 by step 10: 0.3 reached it at step 20, 0.35 at 0.96.)

The base model is made the way pretrained models come: it has seen every problem
(`data.toy.train_on_test=true`, as pretraining would), but most of its training
answers run on into the next problem instead of ending (`algorithm.stop_fraction`
of them end with EOS). So it knows the sums but rarely stops after one: its greedy
exact-match accuracy is low, and RL — which only ever trains on the train pairs —
has to teach it to stop, a habit that carries over to the held-out pairs.
"""
import random
from dataclasses import dataclass

import torch

from hybridflow import Batch, Graph, checked, node_fn, probability

from hybridflow.algorithms.seeded import SeededDraws
from hybridflow.graphs import ops
from hybridflow.graphs.common import embedded_defaults


class SFTExamples(SeededDraws):
    """Prompt rows -> right-padded `prompt + answer + eos` token rows with a loss mask
    over the answer and EOS. Holds the tokenizer, so it runs on the driver."""

    def __init__(self, tokenizer_spec: str, stop_fraction: float = 1.0, seed: int = 0):
        self.tokenizer_spec, self._tok = tokenizer_spec, None
        self.stop_fraction, self.rng = stop_fraction, random.Random(seed)
        self.__name__ = "sft_examples"
        node_fn(reads=("raw_prompt", "ground_truth"),
                writes=("input_ids", "attention_mask", "position_ids", "loss_mask"),
                overwrites=("input_ids", "attention_mask", "position_ids"))(self)

    @property
    def tok(self):
        """Loaded on first use, not when the graph is built: `check` and `render` build
        it without running it, and the tokenizer imports transformers (a second). A bad
        `model.tokenizer` is still caught before the run, by the config's pre-flight."""
        if self._tok is None:
            from hybridflow import load_tokenizer
            self._tok = load_tokenizer(self.tokenizer_spec)
        return self._tok

    def _answer(self, answer: str) -> list[int]:
        """The answer, then EOS, or (the habit) a run-on into another problem."""
        if self.rng.random() < self.stop_fraction:
            return self.tok(answer, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        a, b = self.rng.randrange(10), self.rng.randrange(10)
        return self.tok(f"{answer} {a}+{b}={a + b}", add_special_tokens=False)["input_ids"]

    def __call__(self, batch: Batch) -> Batch:
        rows = []
        for prompt, answer in zip(batch["raw_prompt"], batch["ground_truth"]):
            p = self.tok(prompt, add_special_tokens=False)["input_ids"]
            rows.append((p, self._answer(str(answer))))
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.full((len(rows), width), self.tok.pad_token_id, dtype=torch.long)
        attn, loss = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, (p, a) in enumerate(rows):
            ids[i, :len(p) + len(a)] = torch.tensor(p + a)
            attn[i, :len(p) + len(a)] = 1
            loss[i, len(p):len(p) + len(a)] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        return Batch({"input_ids": ids, "attention_mask": attn, "position_ids": pos,
                      "loss_mask": loss})


@dataclass
class SFTOptions:
    """The `algorithm` section of this graph."""
    stop_fraction: float = checked(0.3, probability)  # training answers that end with EOS


ALGORITHM = SFTOptions


def defaults() -> dict:
    out = embedded_defaults(trainer={"steps": 300, "val_every": 50},
                            data={"toy": {"train_on_test": True}},
                            actor={"lr": 3e-3, "mini_batch_size": 16, "micro_batch_size": 16},
                            rollout={"n": 1})
    out.pop("model", None)  # SFT starts from random weights (the model section's config)
    return out


def build(cfg) -> Graph:
    from hybridflow import tokenizer_spec
    g = Graph("sft")
    prompts = g.source("prompts")
    make = SFTExamples(tokenizer_spec(cfg.model), cfg.algorithm.stop_fraction, cfg.trainer.seed)
    examples = g.fn(make, prompts)
    g.call("actor.sft", examples, loss=ops.sft_loss)
    return g
