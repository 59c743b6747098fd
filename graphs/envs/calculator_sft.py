"""Supervised data for the calculator task's base checkpoint: tool-calling
demonstrations tokenised exactly as the agent rollout will tokenise them.

`demonstration_tokens` builds one example's ids the way an episode is built
(`hybridflow.agents`: the chat format's prompt ids, each model turn's text ids plus
the stop token, each observation's ids from the same chat format), so the base
model learns on the very token layout RL will sample and train on; `loss_mask` is 1
on the model's turns only. `ToolSFTExamples` is the function node that turns prompt
rows into such examples for `actor.sft` (like `graphs/sft.py`'s `SFTExamples`), and
`write_data` writes the train/test rows (verl's schema) for `data.train_files`.

    python -m hybridflow.graphs.envs.calculator_sft OUT_DIR [--train 4000] [--test 200]

State: `ToolSFTExamples` keeps its random generator (which demonstrations it draws),
saved and restored with the run.
"""
from __future__ import annotations

import argparse
import os
import random

import torch

from hybridflow.graphs.envs import calculator
from hybridflow.algorithms.seeded import SeededDraws
from hybridflow import Batch, node_fn
from hybridflow.agents import Trajectory, make_chat_format

__all__ = ["demonstration_tokens", "ToolSFTExamples", "write_data"]


def demonstration_tokens(fmt, prompt: str, pieces: list[tuple[str, bool]]) -> Trajectory:
    """The demonstration as a trajectory: trained pieces are model turns (text ids +
    the stop token), the others observations (the chat format's ids)."""
    stop = min(fmt.stop_ids)
    traj = Trajectory(fmt.prompt_ids(prompt))
    for text, trained in pieces:
        if trained:
            ids = fmt.tokenizer(text, add_special_tokens=False)["input_ids"]
            traj.add_model_turn(list(ids) + [stop])
        else:
            traj.add_observation(fmt.observation_ids(text))
    return traj


class ToolSFTExamples(SeededDraws):
    """Prompt rows (`raw_prompt`, `ground_truth`) -> right-padded demonstrations with
    `loss_mask` on the model's turns. Holds the tokenizer, so it runs on the driver."""

    def __init__(self, tokenizer_spec: str, call_probability: float = 0.7,
                 malformed_probability: float = 0.1, seed: int = 0):
        self.tokenizer_spec, self._fmt = tokenizer_spec, None
        self.call_probability, self.malformed_probability = call_probability, \
            malformed_probability
        self.rng = random.Random(seed)
        self.__name__ = "tool_sft_examples"
        node_fn(reads=("raw_prompt", "ground_truth"),
                writes=("input_ids", "attention_mask", "position_ids", "loss_mask"),
                overwrites=("input_ids", "attention_mask", "position_ids"))(self)

    @property
    def fmt(self):
        """The chat format (plain for the toy tokenizer, else its template), made on first
        use, not when the graph is built: `check` and `render` build it without running
        it, and the tokenizer imports transformers (a second). A bad `model.tokenizer` is
        still caught before the run, by the config's pre-flight."""
        if self._fmt is None:
            from hybridflow import load_tokenizer
            self._fmt = make_chat_format(load_tokenizer(self.tokenizer_spec))
        return self._fmt

    def __call__(self, batch: Batch) -> Batch:
        trajs = []
        for prompt, answer in zip(batch["raw_prompt"], batch["ground_truth"]):
            row = {"prompt": prompt, "reward_model": {"ground_truth": str(answer)}}
            pieces = calculator.demonstration(row, self.rng, self.call_probability,
                                              self.malformed_probability)
            trajs.append(demonstration_tokens(self.fmt, prompt, pieces))
        width = max(len(t.prompt_ids) + len(t) for t in trajs)
        pad = self.fmt.tokenizer.pad_token_id
        ids = torch.full((len(trajs), width), pad, dtype=torch.long)
        attn, loss = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, t in enumerate(trajs):
            n = len(t.prompt_ids) + len(t)
            ids[i, :n] = torch.tensor(t.context_ids())
            attn[i, :n] = 1
            loss[i, len(t.prompt_ids):n] = torch.tensor(t.loss_mask)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        return Batch({"input_ids": ids, "attention_mask": attn, "position_ids": pos,
                      "loss_mask": loss})


def write_data(out_dir: str, n_train: int = 4000, n_test: int = 200, seed: int = 0,
               digits: int = 5) -> tuple[str, str]:
    """train.jsonl and test.jsonl of calculator problems (no problem in both)."""
    from hybridflow import write_rows
    train, test = calculator.train_test_split(n_train, n_test, seed, digits)
    paths = os.path.join(out_dir, "train.jsonl"), os.path.join(out_dir, "test.jsonl")
    write_rows(train, paths[0])
    write_rows(test, paths[1])
    return paths


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="write the calculator task's data")
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--digits", type=int, default=5)
    args = parser.parse_args(argv)
    for path in write_data(args.out_dir, args.train, args.test, args.seed, args.digits):
        print(path)


if __name__ == "__main__":
    main()
