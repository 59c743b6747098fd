"""How the text of an episode becomes token ids, once: the first observation (the
prompt) and each later observation. The model's own turns are never tokenised here:
they stay the ids it sampled.

- `PlainFormat`: the toy tokenizer's plain text, no roles; an observation's ids are
  its text's ids. A model turn ends with EOS.
- `ChatTemplateFormat`: a Hugging Face chat template. The prompt is the template's
  rendering of `[system?, user: first observation]` plus the generation prompt. An
  observation's ids are what the template puts after a finished assistant turn: from
  just after the assistant's stop token (e.g. `<|im_end|>`) through the next
  generation prompt. They are computed against a fixed two-message conversation, so
  earlier turns are never re-rendered (the template cannot change tokens the model
  already sampled, verl issue #6501's drift), and checked to be a prefix-stable
  extension of it (a template that is not is an error at construction).

State: the tokenizer and, for templates, the ids of the fixed base conversation.
"""
from __future__ import annotations

from typing import Protocol

from hybridflow.core.data import unknown_characters

__all__ = ["ChatFormat", "PlainFormat", "ChatTemplateFormat", "make_chat_format"]


class ChatFormat(Protocol):
    stop_ids: frozenset[int]     # a model turn is complete when it ends with one of these

    def prompt_ids(self, first_observation: str) -> list[int]: ...

    def observation_ids(self, observation: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class PlainFormat:
    def __init__(self, tokenizer, stop_ids: set[int] | None = None):
        self.tokenizer = tokenizer
        self.stop_ids = frozenset(stop_ids or {tokenizer.eos_token_id})

    def prompt_ids(self, first_observation: str) -> list[int]:
        return self._encode(first_observation)

    def observation_ids(self, observation: str) -> list[int]:
        return self._encode(observation)

    def _encode(self, text: str) -> list[int]:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        unknown = unknown_characters(self.tokenizer, text, ids)
        if unknown:  # the toy tokenizer knows few characters
            raise ValueError(f"the tokenizer has no token for {unknown!r} in "
                             f"{text[:60]!r}; write observations with characters it knows")
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


_BASE_USER, _BASE_REPLY = "question", "reply"


class ChatTemplateFormat:
    """Observations as messages of `observation_role` ("user", or "tool" where the
    template has it); an optional `system` message opens every episode."""

    def __init__(self, tokenizer, observation_role: str = "user", system: str | None = None,
                 stop_ids: set[int] | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatTemplateFormat needs a tokenizer with a chat_template; "
                             "use PlainFormat for a tokenizer without one")
        self.tokenizer, self.observation_role = tokenizer, observation_role
        self.stop_ids = frozenset(stop_ids or {tokenizer.eos_token_id})
        self.head = [{"role": "system", "content": system}] if system else []
        self.base = self.head + [{"role": "user", "content": _BASE_USER},
                                 {"role": "assistant", "content": _BASE_REPLY}]
        base_ids = self._render(self.base, generation_prompt=False)
        ends = [i for i, t in enumerate(base_ids) if t in self.stop_ids]
        if not ends:
            raise ValueError(f"the chat template ends an assistant message with none of the "
                             f"stop ids {sorted(self.stop_ids)}; pass the ids of the token it "
                             f"ends turns with as stop_ids (rendered: {base_ids[-8:]})")
        self.base_ids = base_ids[:ends[-1] + 1]  # through the assistant's stop token
        self.observation_ids("probe")  # fails here, not mid-rollout, if not prefix-stable

    def _render(self, messages: list[dict], generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tokenize=True,
                                                 add_generation_prompt=generation_prompt)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return an encoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]

    def prompt_ids(self, first_observation: str) -> list[int]:
        return self._render(self.head + [{"role": "user", "content": first_observation}],
                            generation_prompt=True)

    def observation_ids(self, observation: str) -> list[int]:
        message = {"role": self.observation_role, "content": observation}
        full = self._render(self.base + [message], generation_prompt=True)
        cut = len(self.base_ids)
        if full[:cut] != self.base_ids:
            raise ValueError("the chat template renders the earlier turns differently once a "
                             f"{self.observation_role!r} message follows them, so tokens already "
                             "sampled would change; use a template that only appends")
        return full[cut:]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def make_chat_format(tokenizer, **options) -> ChatFormat:
    """A template format when the tokenizer has a chat template, else the plain one."""
    if getattr(tokenizer, "chat_template", None):
        return ChatTemplateFormat(tokenizer, **options)
    return PlainFormat(tokenizer, options.get("stop_ids"))
