"""Tokenizers for the agent tests: the toy character tokenizer and two chat-template
tokenizers built locally (ChatML, and ChatML with a `tool` role)."""
import pytest

from hybridflow.workers.tokenizer import build_char_tokenizer
from tests.support.agent_fakes import CHATML, CHATML_TOOL, build_chat_tokenizer


@pytest.fixture(scope="session")
def char_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="session")
def chatml_tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chatml"), CHATML)


@pytest.fixture(scope="session")
def chatml_tool_tokenizer(tmp_path_factory):
    return build_chat_tokenizer(tmp_path_factory.mktemp("chatml_tool"), CHATML_TOOL)
