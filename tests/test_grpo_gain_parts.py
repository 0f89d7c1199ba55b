"""benchmarks/grpo_gain.py names the engine that sampled GRPO's prompts, read from the selection
stage's own last line. (The whole benchmark runs in tests/slow/test_grpo_gain.py.)"""

from __future__ import annotations

from benchmarks import grpo_gain


def test_the_selection_engine_is_read_from_the_stages_last_line():
    out = ("backend auto: vllm\nselection: kept 163 of 800 prompts (never solved 613, always solved 24) -> "
           "data/selected/prompts.jsonl (75.9 s, vllm)\n")
    assert grpo_gain.selection_backend(out) == "vllm"
    assert grpo_gain.selection_backend(out.replace("vllm)", "transformers)")) == "transformers"
    assert grpo_gain.selection_backend("the stage printed nothing\n") == "unknown"
