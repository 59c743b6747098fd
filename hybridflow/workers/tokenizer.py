"""Tokenizers: the toy task's character tokenizer, built in code, or a local HF dir.

The character tokenizer is a real `PreTrainedTokenizerFast` (a `tokenizers`
WordLevel model over single characters), so `save_pretrained` and
`AutoTokenizer.from_pretrained` work on it like on any other. Prompts are padded
on the left (generation appends on the right).

Nothing is downloaded at run time: a spec that is neither "char" nor an existing
local directory is an error.
"""
from __future__ import annotations

import os
import string

__all__ = ["build_char_tokenizer", "load_tokenizer", "require_local_dir", "tokenizer_spec",
           "CHAR_VOCAB"]

SPECIAL_TOKENS = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}
CHAR_VOCAB = (string.digits + "+-*/=()., :?!\n" + string.ascii_lowercase
              + string.ascii_uppercase)


def require_local_dir(spec: str, what: str) -> str:
    """`spec` if it is an existing local directory; otherwise a clear error."""
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return path
    if os.path.exists(path) and path.endswith(".gguf"):
        from hybridflow.workers.gguf import gguf_hint
        raise ValueError(f"{what}: {gguf_hint(spec)}")
    if os.path.lexists(path):
        from hybridflow.core.loading import describe_path
        kind = describe_path(path)
        what_it_is = f"is {kind}, not a directory" if kind else "is a file"
        raise ValueError(f"{what} {spec!r} {what_it_is}; give the directory that holds it")
    raise FileNotFoundError(
        f"{what} {spec!r} is not a local directory. hybridflow does not download "
        f"models or tokenizers at run time: {missing_model_hint(spec)}")


def missing_model_hint(spec: str) -> str:
    """How to make the model directory `spec` names: the project's own command for a
    local path (a GGUF conversion; the shipped SmolLM2 by name), the hub's download
    for what reads as a hub id ("org/name" whose "org" is no local folder)."""
    make = (f"`hybridflow model smollm2 --out {spec}`" if "smollm2" in spec.lower() else
            f"`hybridflow model gguf FILE.gguf --out {spec}` (from a GGUF file)")
    head = spec.split("/")[0]
    hub_id = (spec.count("/") == 1 and not spec.startswith((".", "~", "/"))
              and not os.path.isdir(head))
    if hub_id and "smollm2" not in spec.lower():
        return (f"for the Hugging Face model {spec}, download it beforehand "
                f"(`huggingface-cli download {spec} --local-dir /path/to/dir`) and pass that "
                f"directory; to make a local directory, {make}")
    return (f"make it with {make}, or pass the directory that holds the model "
            f"(docs/real_model.md)")


def build_char_tokenizer():
    """A character-level `PreTrainedTokenizerFast` for the toy arithmetic task."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in CHAR_VOCAB:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk"]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=SPECIAL_TOKENS["pad"],
        eos_token=SPECIAL_TOKENS["eos"], bos_token=SPECIAL_TOKENS["bos"],
        unk_token=SPECIAL_TOKENS["unk"], padding_side="left",
        clean_up_tokenization_spaces=False, model_max_length=4096)
    return tok


def load_tokenizer(spec: str = "char"):
    """"char" for the built-in tokenizer, or a local directory (`AutoTokenizer`)."""
    if spec == "char":
        return build_char_tokenizer()
    from transformers import AutoTokenizer

    from hybridflow.core.loading import library_read
    folder = require_local_dir(spec, "tokenizer")
    with library_read(folder, "tokenizer directory", "its tokenizer files are damaged: "
                      "save the tokenizer again (tokenizer.save_pretrained(dir))"):
        tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token_id is None:  # common for decoder-only LMs: pad with EOS
        tok.pad_token = tok.eos_token
    return tok


def tokenizer_spec(model_cfg) -> str:
    """What to load for a model section: its `tokenizer`, where "auto" means the
    model's own directory (or "char" for a model built from a config)."""
    spec = getattr(model_cfg, "tokenizer", "char") or "auto"
    if spec == "auto":
        return model_cfg.path or "char"
    return spec
