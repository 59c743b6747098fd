"""docs/functions.md's table of what `actor.generate` returns lists every column the
actor's generate writes (issue 36: `rollout_log_probs`, `policy_version` and
`token_versions` were missing), and no column it does not write."""
from __future__ import annotations

import os
import re

from hybridflow.workers import ActorWorker
from tests.support.workers import PROMPTS, make_cfg, prompt_batch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORWARDED = {"uid", "data_source", "ground_truth", "extra_info", "raw_prompt"}  # the prompts'


def _documented() -> set[str]:
    with open(os.path.join(REPO, "docs", "functions.md"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("## What `actor.generate` returns", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", section, re.M))


def test_the_docs_table_lists_every_column_generate_writes():
    actor = ActorWorker(make_cfg())
    out = actor.generate(prompt_batch(actor.tokenizer, PROMPTS), n=2)
    written = set(out.keys()) - FORWARDED
    documented = _documented()
    assert {"policy_version", "token_versions", "rollout_log_probs"} <= written
    assert written == documented, (f"in generate, not in the table: {written - documented}; "
                                   f"in the table, not written: {documented - written}")
