"""Fakes for the agent tests and bench: a generator whose turns depend only on the
context it is fed (so any schedule yields the same episodes), an environment scripted
by its row, and a locally built chat-template tokenizer (no downloads)."""
from __future__ import annotations

import hashlib
import random
import time

from hybridflow.agents import GeneratedTurn, StepResult

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
# Tool results shown as a user message wrapped in tags, the way Qwen's template does.
CHATML_TOOL = ("{% for m in messages %}{% if m['role'] == 'tool' %}"
               "{{ '<|im_start|>user\\n<tool_response>\\n' + m['content'] + "
               "'\\n</tool_response><|im_end|>\\n' }}{% else %}"
               "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
               "{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
WORDS = ("the sum of calc answer tool result add number is what please compute "
         "twelve forty two seven <calc> </calc> 12+30 = 42 ok yes no").split()


def build_chat_tokenizer(folder, template: str = CHATML):
    """A byte-level BPE `PreTrainedTokenizerFast` with a ChatML template, trained on a
    few words in memory, saved to `folder` and loaded back with AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)]
    core.train_from_iterator(corpus, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", chat_template=template)
    tok.save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


PLAIN_WORDS = [w for w in WORDS if "<" not in w]  # what the toy tokenizer can write


def random_text(rng: random.Random, words: int = 4, vocabulary=WORDS) -> str:
    return " ".join(rng.choice(vocabulary) for _ in range(rng.randint(1, words)))


class ContextGenerator:
    """Turns drawn from a generator seeded by the context's ids: any schedule that
    feeds the same contexts gets the same turns. `call_cost_s` sleeps once per call
    (a generator of fixed per-call cost). Records every context it was fed."""

    def __init__(self, token_ids: list[int], stop_id: int, max_len: int = 6,
                 call_cost_s: float = 0.0, stop_probability: float = 0.95):
        self.token_ids, self.stop_id, self.max_len = list(token_ids), stop_id, max_len
        self.call_cost_s, self.stop_probability = call_cost_s, stop_probability
        self.fed: list[list[int]] = []
        self.sampled: dict[tuple, list[int]] = {}   # context -> the turn it got (cut later)

    def __call__(self, contexts, max_new_tokens):
        if self.call_cost_s:
            time.sleep(self.call_cost_s)
        turns = []
        for context in contexts:
            self.fed.append(list(context))
            seed = hashlib.sha1(str(context).encode()).hexdigest()
            rng = random.Random(seed)
            ids = [rng.choice(self.token_ids) for _ in range(rng.randint(1, self.max_len))]
            if rng.random() < self.stop_probability:
                ids.append(self.stop_id)
            ids = ids[:max_new_tokens]
            turns.append(GeneratedTurn(ids, [-rng.random() for _ in ids]))
        return turns


class ScriptedEnv:
    """Reads its script from the row: `prompt`, `turns` (steps until done), `reward`,
    `observations` (one text per step), `latency_s` (per step, a list or a number)."""

    def reset(self, row):
        self.row, self.steps = row, 0
        return row["prompt"]

    def step(self, turn):
        latency = self.row.get("latency_s", 0.0)
        if isinstance(latency, list):
            latency = latency[self.steps % len(latency)]
        if latency:
            time.sleep(latency)
        self.steps += 1
        if self.steps >= self.row["turns"]:
            return StepResult(reward=self.row.get("reward", 1.0), done=True)
        observations = self.row.get("observations") or ["ok"]
        return StepResult(observation=observations[(self.steps - 1) % len(observations)],
                          tool_calls=1)


def scripted_rows(n: int, seed: int, max_turns: int = 4, latency_ms: tuple = (0, 0),
                  vocabulary=PLAIN_WORDS):
    rng = random.Random(seed)
    return [{"prompt": random_text(rng, 6, vocabulary), "turns": rng.randint(1, max_turns),
             "reward": 1.0,
             "observations": [random_text(rng, 4, vocabulary) for _ in range(max_turns)],
             "latency_s": [rng.uniform(*latency_ms) / 1000 for _ in range(max_turns)]}
            for _ in range(n)]
