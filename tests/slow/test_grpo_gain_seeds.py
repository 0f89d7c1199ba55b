"""`benchmarks/grpo_gain.py --seeds` on a tiny configuration: the whole recipe once per data seed
(each its own test split), one object per seed with the keys benchmarks/RESULTS.md quotes, and the
pooled GRPO - SFT comparison over every seed's items. A few minutes on two cores.

    pytest -q tests/slow/test_grpo_gain_seeds.py
"""

from __future__ import annotations

import json

import pytest

from benchmarks import grpo_gain
from components.evaluation.stats import compare_paired
from tests.slow.test_grpo_gain import TINY

pytestmark = pytest.mark.slow

# A 4-step SFT model solves nothing: keep the unsolved prompts so that GRPO has some.
SELECT = ["selection.num_samples=2", "selection.keep_unsolved=true", "selection.min_prompts=1",
          "selection.max_new_tokens=16", "selection.backend=transformers"]


def test_seeds_run_the_recipe_per_data_seed_and_pool_the_items(tmp_path, capsys):
    keep = tmp_path / "gain"
    assert grpo_gain.main([*(a for o in [*TINY, *SELECT] for a in ("-S", o)), "--seeds", "11,12", "--k", "2",
                           "--sample-items", "4", "--keep", str(keep)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [r["seed"] for r in result["seeds"]] == [11, 12]
    for run in result["seeds"]:
        for key in ("n", "sft_accuracy_flexible", "grpo_accuracy_flexible", "sft_continued_accuracy_flexible",
                    "training_seconds", "sft_sampled_accuracy", "grpo_sampled_accuracy", "sft_pass_at_k",
                    "grpo_pass_at_k"):
            assert key in run, key
        assert run["n"] == 8
        parts = run["sft_seconds"] + run["selection_seconds"] + run["grpo_seconds"]
        assert run["training_seconds"] == pytest.approx(parts, abs=0.2)
    # each seed ran in its own folder on its own data
    tests = [(keep / f"seed-{s}" / "data" / "processed" / "test.jsonl").read_text() for s in (11, 12)]
    assert tests[0] != tests[1]
    # per seed: the target band (evaluate.target_band, 3 steps), the other bands and every step count
    keys = {"n", "sft_accuracy_flexible", "grpo_accuracy_flexible", "control_accuracy_flexible", "delta", "ci95",
            "p_value", "delta_vs_control", "p_vs_control"}
    for run in result["seeds"]:
        assert run["target_band"] == "3" and keys <= set(run["target"]) and keys <= set(run["in_band"])
        assert sum(b["n"] for b in run["bands"].values()) == 8 == run["target"]["n"] + run["in_band"]["n"]
        # beside each slice, the same on right answers with no wrong equation (never above the flexible accuracy)
        checked = run["target"]["checked"]
        assert checked["grpo_accuracy_checked"] <= run["target"]["grpo_accuracy_flexible"]
        assert checked["sft_accuracy_checked"] <= run["target"]["sft_accuracy_flexible"]
    # the pooled tests are the exact McNemar over both seeds' paired items, re-derived from the items
    pairs = {"target": [], "in_band": []}
    for s in (11, 12):
        items = {m: {json.loads(x)["id"]: json.loads(x) for x in open(keep / f"seed-{s}" / "items" / f"{m}.jsonl")}
                 for m in ("sft", "grpo")}
        for i, g in items["grpo"].items():
            pairs["target" if g["steps"] == 3 else "in_band"].append(
                (g["correct_flexible"], items["sft"][i]["correct_flexible"]))
    pooled = result["pooled"]
    for part, rows in pairs.items():
        expected = compare_paired([g for g, _ in rows], [s for _, s in rows])
        assert pooled[part]["n"] == expected["n"]
        assert pooled[part]["delta"] == expected["delta"] and pooled[part]["p_value"] == expected["p_value"]
    assert pooled["target"]["n"] + pooled["in_band"]["n"] == 16
    # the headline: the band
    assert (pooled["n"], pooled["delta"]) == (pooled["target"]["n"], pooled["target"]["delta"])
