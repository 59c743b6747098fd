"""Defaults shared by the graph files: the embedded default task and model.

The embedded default trains the tiny base checkpoint shipped in graphs/assets/toy_base
(made by graphs/sft.py) on the toy arithmetic task, on the CPU, with the local runtime.
"""
from __future__ import annotations

import copy
import os

TOY_BASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets", "toy_base")


def merge(base: dict, extra: dict) -> dict:
    """Nested dict merge: `extra` wins."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def embedded_defaults(**overrides) -> dict:
    """Tiny model, toy task, CPU: what `hybridflow run graphs/<algo>.py` runs with no
    argument. Each graph adds its own knobs on top."""
    base = {
        "trainer": {"steps": 40, "val_every": 10},
        "data": {"batch_size": 16, "max_prompt_length": 8},
        # one generate call and few log-prob chunks per step: the toy model is tiny
        "rollout": {"n": 8, "max_new_tokens": 4, "temperature": 1.0, "micro_batch_size": 128,
                    "log_prob_micro_batch_size": 64},
        "ref": {"micro_batch_size": 64},
        "actor": {"lr": 2e-4, "mini_batch_size": 64, "micro_batch_size": 64,
                  "ppo_epochs": 1, "grad_clip": 1.0},
        "critic": {"lr": 1e-3, "mini_batch_size": 64, "micro_batch_size": 64},
    }
    if os.path.isfile(os.path.join(TOY_BASE, "config.json")):
        base["model"] = {"path": TOY_BASE, "tokenizer": "auto"}
    return merge(base, overrides)
