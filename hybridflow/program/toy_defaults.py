"""The one note a run on a model of the user's own gets when sizes and rates still
come from the graph file's `defaults()`, which are sized for the shipped toy model.

The embedded default (graphs/common.py) trains a ~3M-parameter model on 8-token
prompts with 4-token answers at lr 2e-4; on a real pretrained model those values stop
the run one at a time (prompts "longer than data.max_prompt_length=8", a mini-batch
larger than the batch) or, worse, train it at a learning rate two orders of magnitude
too high. So when `model.path` is given on purpose (command line or --config) and
these keys are not, the run says so once, naming each key and its value.
"""
from __future__ import annotations

from omegaconf import OmegaConf

__all__ = ["TOY_SIZED_KEYS", "toy_defaults_note"]

# keys whose graph default is the toy's size or rate
TOY_SIZED_KEYS = ("data.max_prompt_length", "rollout.max_new_tokens", "data.batch_size",
                  "actor.mini_batch_size", "actor.micro_batch_size", "actor.lr")


def _is_set(key: str, explicit: set[str]) -> bool:
    return any(key == k or key.startswith(k + ".") for k in explicit)


def toy_defaults_note(cfg, explicit: set[str]) -> str | None:
    """The note, or None: when the model is the graph's own, or every key is set."""
    if not _is_set("model.path", explicit) or not cfg.model.path:
        return None
    left = [(key, OmegaConf.select(cfg, key)) for key in TOY_SIZED_KEYS
            if not _is_set(key, explicit)]
    if not left:
        return None
    values = ", ".join(f"{key}={value}" for key, value in left)
    return (f"model.path={cfg.model.path} is your model, but {values} are the graph's "
            f"defaults, sized for the toy model (3M parameters, 8-token prompts); set them "
            f"for yours (graphs/configs/smollm2_arith.yaml has values for a 135M model)")
