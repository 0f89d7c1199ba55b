"""Stage selection: GRPO's prompts chosen by the SFT model's pass rate. A real tiny model samples real
completions (transformers backend); the band, the counts, the histogram, the MLflow run, and the stop
with the counts when too few prompts are kept.

    pytest -q tests/test_selection.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components import selection
from components.common.errors import ConfigError
from components.common.params import DataParams, ModelParams, SelectionParams
from pipelines.params.config import load_params

TINY = dict(tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=128)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """Answer-only GRPO problems and a tiny (untrained: it solves nothing) SFT model."""
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    root = tmp_path_factory.mktemp("selectrepo")
    data.write_splits(DataParams(output_dir=str(root / "data/processed"), synthetic_train_size=40,
                                 synthetic_test_size=4, synthetic_max_steps=1, synthetic_answer_only_size=24))
    model, tok = model_stage.build_tiny(ModelParams(seed=1, **TINY), root / "data/processed/train.jsonl")
    save_model(model, tok, root / "models/sft")
    return root


@pytest.fixture(autouse=True)
def inside_the_workspace(workspace, monkeypatch):
    monkeypatch.chdir(workspace)


def params(root: Path, *extra: str):
    return load_params(None, [
        f"data.output_dir={root / 'data/processed'}",
        f"selection.model_dir={root / 'models/sft'}",
        f"selection.output_file={root / 'data/selected/prompts.jsonl'}",
        f"selection.metrics_file={root / 'reports/train/selection.json'}",
        f"selection.histogram_file={root / 'reports/train/selection_pass_rates.csv'}",
        "selection.backend=transformers",
        "selection.num_samples=2",
        "selection.max_new_tokens=8",
        "selection.mode=strict",  # an untrained model never tags an answer (its last number may match by chance)
        "grpo.trainer.num_generations=4",
        "grpo.trainer.per_device_train_batch_size=8",
        *extra,
    ])


def test_a_model_that_solves_nothing_stops_the_stage_with_the_counts(workspace, capsys):
    """The stage's command line: one line on stderr naming the counts and the params, exit code 2,
    and no output for GRPO to train on."""
    import shutil

    shutil.rmtree(workspace / "data/selected", ignore_errors=True)
    overrides = [f"data.output_dir={workspace / 'data/processed'}", f"selection.model_dir={workspace / 'models/sft'}",
                 f"selection.output_file={workspace / 'data/selected/prompts.jsonl'}", "selection.backend=transformers",
                 "selection.num_samples=2", "selection.max_new_tokens=8", "selection.min_prompts=5",
                 "selection.mode=strict"]
    assert selection.main([a for o in overrides for a in ("-S", o)]) == 2
    msg = capsys.readouterr().err.strip().splitlines()[-1]
    assert msg.startswith("error: selection kept 0 of 24 prompts (never solved 24, always solved 0")
    assert "GRPO needs at least 5" in msg and "selection.keep_unsolved=true" in msg
    assert not (workspace / "data/selected").exists()


def test_selection_writes_kept_prompts_pass_rates_counts_and_histogram(workspace):
    out = selection.choose_prompts(params(workspace, "selection.keep_unsolved=true", "selection.min_prompts=5",
                                          "selection.max_candidates=20"))
    rows = [json.loads(x) for x in (workspace / "data/selected/prompts.jsonl").read_text().splitlines()]
    grpo = [json.loads(x) for x in (workspace / "data/processed/grpo.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in grpo[:20]]  # the first max_candidates, all kept
    assert {r["pass_rate"] for r in rows} == {0.0} and {r["solution"] for r in rows} == {""}
    # The DVC metrics file holds the counts only (few columns in `dvc metrics show`); MLflow gets the rest.
    metrics = json.loads((workspace / "reports/train/selection.json").read_text())
    assert metrics == {"candidates": 20, "kept": 20, "never_solved": 20, "always_solved": 0}
    assert out["metrics"]["backend"] == "transformers" and out["metrics"]["num_samples"] == 2
    hist = (workspace / "reports/train/selection_pass_rates.csv").read_text().splitlines()
    assert hist == ["pass_rate,prompts,kept", "0.0,20,True", "0.5,0,True", "1.0,0,False"]


def test_no_sampling_keeps_every_candidate(workspace):
    out = selection.choose_prompts(params(workspace, "selection.num_samples=0", "selection.min_prompts=1"))
    assert out["metrics"]["kept"] == 24 and out["metrics"]["backend"] == "none" and out["histogram"] == []


def test_the_stage_logs_counts_and_the_histogram_figure_to_mlflow(workspace):
    import mlflow

    selection.run(params(workspace, "selection.keep_unsolved=true", "selection.min_prompts=5"))
    run = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`grpoflow.stage` = 'selection'",
                             output_format="list")[0]
    assert run.data.metrics["kept"] == 24.0 and run.data.metrics["never_solved"] == 24.0
    files = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "selection")}
    assert files == {"selection/pass_rates.png", "selection/selection_pass_rates.csv"}


@pytest.mark.parametrize(
    "settings, rates, kept",
    [
        ({}, [0.0, 0.125, 0.5, 0.875, 1.0], [False, True, True, True, False]),  # default: 0 < p < 1
        ({"keep_unsolved": True}, [0.0, 1.0], [True, False]),
        ({"keep_solved": True, "min_pass_rate": 0.5}, [0.25, 0.5, 1.0], [False, True, True]),
        ({"max_pass_rate": 0.5}, [0.125, 0.5, 0.75], [True, True, False]),
    ],
)
def test_selection_keeps_the_prompts_whose_pass_rate_is_in_the_band(settings, rates, kept):
    assert [selection.pass_rate_kept(r, SelectionParams(**settings)) for r in rates] == kept


def test_an_empty_band_fails_naming_both_keys():
    with pytest.raises(ConfigError, match=r"selection.min_pass_rate \(0.8\) is above selection.max_pass_rate \(0.2\)"):
        load_params(None, ["selection.min_pass_rate=0.8", "selection.max_pass_rate=0.2"])
