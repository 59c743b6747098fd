"""Supervised fine-tuning: learn `prompt + answer + EOS` with the loss on the answer.

It also makes the embedded default's base model. Remake it with:

    hybridflow run graphs/sft.py trainer.run_name=toy_base
    hybridflow export runs/toy_base graphs/assets/toy_base

The SFT run is deliberately short (a few hundred examples), so the base model has
learned the answer format but is often wrong on held-out problems: RL has something
left to do.
"""
import torch

from hybridflow import Batch, Graph, node_fn

from graphs.common import embedded_defaults


class SFTExamples:
    """Prompt rows -> right-padded `prompt + answer + eos` token rows with a loss mask
    over the answer and EOS. Holds the tokenizer, so it runs on the driver."""

    def __init__(self, tokenizer_spec: str):
        from hybridflow.workers.tokenizer import load_tokenizer
        self.tok = load_tokenizer(tokenizer_spec)
        self.__name__ = "sft_examples"
        node_fn(reads=("raw_prompt", "ground_truth"),
                writes=("input_ids", "attention_mask", "position_ids", "loss_mask"),
                overwrites=("input_ids", "attention_mask", "position_ids"))(self)

    def __call__(self, batch: Batch) -> Batch:
        rows = []
        for prompt, answer in zip(batch["raw_prompt"], batch["ground_truth"]):
            p = self.tok(prompt, add_special_tokens=False)["input_ids"]
            a = self.tok(str(answer), add_special_tokens=False)["input_ids"]
            rows.append((p, a + [self.tok.eos_token_id]))
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


def defaults() -> dict:
    out = embedded_defaults(trainer={"steps": 30, "val_every": 10},
                            actor={"lr": 3e-3, "mini_batch_size": 16, "micro_batch_size": 16},
                            rollout={"n": 1})
    out.pop("model", None)  # SFT starts from random weights (the model section's config)
    return out


def build(cfg) -> Graph:
    from hybridflow.workers.tokenizer import tokenizer_spec
    g = Graph("sft")
    prompts = g.source("prompts")
    examples = g.fn(SFTExamples(tokenizer_spec(cfg.model)), prompts)
    g.call("actor.sft", examples)
    return g
