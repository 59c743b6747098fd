"""The character tokenizer is a real HF tokenizer; hub ids are refused with advice."""
import pytest
from transformers import AutoTokenizer

from hybridflow.workers.tokenizer import build_char_tokenizer, load_tokenizer


def test_char_tokenizer_round_trips_through_save_pretrained(tmp_path):
    tok = build_char_tokenizer()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "12+7=19 ok"
    assert loaded(text)["input_ids"] == tok(text)["input_ids"]
    assert loaded.decode(tok(text)["input_ids"]) == text
    assert (loaded.pad_token_id, loaded.eos_token_id) == (tok.pad_token_id, tok.eos_token_id)
    assert load_tokenizer(str(tmp_path)).padding_side == "left"


def test_prompts_are_left_padded():
    tok = load_tokenizer("char")
    enc = tok(["1+2=", "10+20="], padding=True)
    assert enc["input_ids"][0][:2] == [tok.pad_token_id] * 2
    assert enc["attention_mask"][0] == [0, 0, 1, 1, 1, 1]


def test_hub_id_gives_a_clear_no_download_error():
    with pytest.raises(FileNotFoundError, match="does not download"):
        load_tokenizer("Qwen/Qwen2.5-0.5B")
