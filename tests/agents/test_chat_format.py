"""Chat formats: observations as the template's own tokens after a finished turn,
and templates that would change already-sampled tokens are refused up front."""
import pytest

from hybridflow.agents import ChatTemplateFormat, PlainFormat, make_chat_format
from tests.support.agent_fakes import build_chat_tokenizer

# Marks the last message specially: appending a message re-renders the one before it.
LAST_IS_SPECIAL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + "
                   "m['content'] }}{% if loop.last %}{{ ' (last)' }}{% endif %}"
                   "{{ '<|im_end|>\\n' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
NO_END_TOKEN = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


def test_an_observation_is_what_the_template_adds_after_the_stop_token(chatml_tokenizer):
    fmt = ChatTemplateFormat(chatml_tokenizer)
    tok = chatml_tokenizer
    text = tok.decode(fmt.observation_ids("add 12+30"))
    assert text == "\n<|im_start|>user\nadd 12+30<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(fmt.prompt_ids("hi")) == "<|im_start|>user\nhi<|im_end|>\n" \
                                                "<|im_start|>assistant\n"


def test_a_system_message_opens_every_episode(chatml_tokenizer):
    fmt = ChatTemplateFormat(chatml_tokenizer, system="be brief")
    assert chatml_tokenizer.decode(fmt.prompt_ids("hi")).startswith(
        "<|im_start|>system\nbe brief<|im_end|>")


def test_a_template_that_re_renders_earlier_turns_is_refused(tmp_path):
    tok = build_chat_tokenizer(tmp_path, LAST_IS_SPECIAL)
    with pytest.raises(ValueError, match="renders the earlier turns differently"):
        ChatTemplateFormat(tok)


def test_a_template_without_the_stop_token_asks_for_stop_ids(tmp_path):
    tok = build_chat_tokenizer(tmp_path, NO_END_TOKEN)
    with pytest.raises(ValueError, match="pass the ids of the token it ends turns with"):
        ChatTemplateFormat(tok)


def test_the_toy_tokenizer_gets_the_plain_format(char_tokenizer):
    fmt = make_chat_format(char_tokenizer)
    assert isinstance(fmt, PlainFormat)
    assert fmt.stop_ids == {char_tokenizer.eos_token_id}
    assert char_tokenizer.decode(fmt.observation_ids("\ncalc: 42\n")) == "\ncalc: 42\n"
    with pytest.raises(ValueError, match="needs a tokenizer with a chat_template"):
        ChatTemplateFormat(char_tokenizer)
    with pytest.raises(ValueError, match="has no token for '<>' in '<calc>1</calc>'"):
        fmt.observation_ids("<calc>1</calc>")
