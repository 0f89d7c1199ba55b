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


def test_rescore_reports_kept_runs_with_todays_scorer_and_tells_guesses_from_solutions(tmp_path, capsys):
    """Two kept runs written before `correct_checked` existed: GRPO's new right answers on the 3-step
    band are wrong equations that land on the gold. --rescore judges the kept completions again."""
    import json
    import shutil

    def completion(work: str, answer: str) -> str:
        return f"<reasoning>\n{work}\n</reasoning>\n<answer>\n{answer}\n</answer>"

    wrong = completion("2 - 1 = 1\n4 - 1 = 1", "1")
    right = completion("4 - 1 = 3\n3 - 2 = 1", "1")
    miss = completion("4 - 1 = 3", "3")
    folders = []
    for seed in (1, 2):
        folder = tmp_path / f"seed-{seed}"
        (folder / "items").mkdir(parents=True)
        shutil.copy(grpo_gain.REPO / "params.yaml", folder / "params.yaml")  # evaluate.target_band: 3
        models = {"sft": [miss] * 10 + [right] * 10, "grpo": [wrong] * 8 + [miss] * 2 + [right] * 10,
                  "sft_continued": [miss] * 10 + [right] * 10}
        for name, texts in models.items():
            rows = [{"id": f"t{i}", "gold": "1", "completion": t, "steps": 3 if i < 10 else 1,
                     "correct_flexible": t != miss} for i, t in enumerate(texts)]
            (folder / "items" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        folders.append(str(folder))
    assert grpo_gain.main(["--rescore", *folders]) == 0
    out = json.loads(capsys.readouterr().out)
    target = out["pooled"]["target"]
    assert target["n"] == 20 and target["delta"] == 0.8 and target["p_value"] < 0.001
    assert target["checked"]["grpo_accuracy_checked"] == 0.0 and target["checked"]["delta"] == 0.0
    assert out["pooled"]["in_band"]["checked"]["grpo_accuracy_checked"] == 1.0
    every = out["pooled"]["all"]  # every problem, whatever its band: 16 wrong, then 24 right in both
    assert every["n"] == 40 and every["checked"]["grpo_accuracy_checked"] == 0.5 and every["delta"] == 0.4
    assert [s["folder"] for s in out["seeds"]] == folders
    # the band the runs were made with (-S), not the folder's params.yaml default
    assert grpo_gain.main(["--rescore", folders[0], "-S", "evaluate.target_band=1"]) == 0
    out = json.loads(capsys.readouterr().out)["seeds"][0]
    assert (out["target_band"] == "1" and out["target"]["n"] == 10
            and out["target"]["checked"]["grpo_accuracy_checked"] == 1.0)
