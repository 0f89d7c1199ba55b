"""Where lm-eval-gsm8k's few-shot examples come from: the rules (`lm_eval_gsm8k.choose_fewshot_source`)
table by table, and `grpoflow evaluate` printing and recording the source it used (the log line, the
report's `fewshot_source`, the MLflow tag) or refusing, before any MLflow run, when there is none.

    pytest -q tests/test_fewshot_source.py
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from components.common.errors import EvaluationError
from components.evaluation import lm_eval_gsm8k, scoring
from pipelines import cli
from pipelines.params.config import DataParams, ModelParams, load_params

TINY = dict(tiny_hidden_size=64, tiny_num_heads=2, tiny_num_layers=1, tiny_intermediate_size=128)


def gsm8k_rows(n: int, offset: int = 0) -> str:
    return "".join(
        json.dumps({"question": f"Ann has {a} pens and gets 2 more. How many pens?",
                    "answer": f"{a} + 2 = <<{a}+2={a + 2}>>{a + 2}\n#### {a + 2}"}) + "\n"
        for a in range(offset, offset + n)
    )


@pytest.fixture
def layout(tmp_path):
    """gsm8k/{train,test,dev}.jsonl (GSM8K's layout), lone/test.jsonl (no train file beside it)."""
    for rel in ("gsm8k/train.jsonl", "gsm8k/test.jsonl", "gsm8k/dev.jsonl", "lone/test.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(gsm8k_rows(8))
    return tmp_path


# (explicit evaluate.fewshot_source, --data, expected source or None for a refusal, expected rule)
RULES = [
    ("", "hf:openai/gsm8k:main", "hf:openai/gsm8k:main", "the train split of the data source"),
    ("", "hf:some/local_folder", "hf:some/local_folder", "the train split of the data source"),
    ("", "jsonl:{t}/prep/test.jsonl", "jsonl:{t}/prep/train.jsonl", "the prepared train split"),  # not there yet
    ("", "jsonl:{t}/gsm8k/test.jsonl", "jsonl:{t}/gsm8k/train.jsonl", "the train.jsonl beside the test file"),
    ("", "jsonl:{t}/gsm8k/dev.jsonl", "jsonl:{t}/gsm8k/train.jsonl", "the train.jsonl beside the test file"),
    ("", "jsonl:{t}/lone/test.jsonl", None, "no such file"),
    ("", "jsonl:{t}/gsm8k/train.jsonl", None, "it is the test file itself"),
    ("jsonl:{t}/gsm8k/dev.jsonl", "jsonl:{t}/gsm8k/test.jsonl", "jsonl:{t}/gsm8k/dev.jsonl",
     "set by evaluate.fewshot_source"),
    ("jsonl:{t}/gsm8k/train.jsonl", "jsonl:{t}/lone/test.jsonl", "jsonl:{t}/gsm8k/train.jsonl",
     "set by evaluate.fewshot_source"),
    ("hf:openai/gsm8k:main", "hf:other/data", "hf:openai/gsm8k:main", "set by evaluate.fewshot_source"),
    ("hf:openai/gsm8k:main", "jsonl:{t}/prep/test.jsonl", "hf:openai/gsm8k:main", "set by evaluate.fewshot_source"),
]


@pytest.mark.parametrize("explicit,data,expected,rule", RULES)
def test_fewshot_source_is_chosen_by_its_rule_or_refused_in_one_line(layout, explicit, data, expected, rule):
    t = str(layout)
    explicit, data = explicit.format(t=t), data.format(t=t)
    if expected is None:
        with pytest.raises(EvaluationError) as err:
            lm_eval_gsm8k.choose_fewshot_source(explicit, data, f"{t}/prep")
        message = str(err.value)
        assert "\n" not in message and "evaluate.fewshot_source" in message and data in message and rule in message
        return
    chosen = lm_eval_gsm8k.choose_fewshot_source(explicit, data, f"{t}/prep")
    assert (chosen.source, chosen.split, chosen.rule) == (expected.format(t=t), "train", rule)


def test_the_prepared_test_split_is_matched_by_path_not_by_spelling(layout, monkeypatch):
    monkeypatch.chdir(layout)
    chosen = lm_eval_gsm8k.choose_fewshot_source("", f"jsonl:{layout}/prep/./test.jsonl", "prep")
    assert chosen.rule == "the prepared train split" and chosen.source == "jsonl:prep/train.jsonl"


def test_scoring_uses_the_params(layout, monkeypatch):
    monkeypatch.chdir(layout)
    params = load_params(overrides=[f"data.output_dir={layout / 'prep'}"])
    default = scoring.fewshot_source(params, scoring.data_source(params))  # the evaluate stage's own data
    assert (default.source, default.rule) == (f"jsonl:{layout / 'prep' / 'train.jsonl'}", "the prepared train split")
    params.evaluate.fewshot_source = f"jsonl:{layout}/gsm8k/dev.jsonl"
    assert scoring.fewshot_source(params, "jsonl:x.jsonl").source == params.evaluate.fewshot_source
    params.evaluate.num_fewshot = 0  # 0-shot needs no examples: nothing to choose, nothing refused
    assert scoring.fewshot_source(params, f"jsonl:{layout}/lone/test.jsonl") is None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from components import data
    from components import model as model_stage
    from components.models.modelio import save_model

    root = tmp_path_factory.mktemp("fewshot")
    data.write_splits(DataParams(output_dir=str(root / "prep"), synthetic_train_size=40, synthetic_test_size=4,
                                 synthetic_test_top_band_size=0))
    model, tok = model_stage.build_tiny(ModelParams(seed=1, **TINY), root / "prep/train.jsonl")
    save_model(model, tok, root / "model")
    return root


class LogLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def evaluate_args(root: Path, data: str, out: Path) -> list[str]:
    args = ["evaluate", "--model", str(root / "model"), "--data", data, "--protocol", "lm-eval-gsm8k",
            "--backend", "transformers", "--limit", "2", "--output", str(out)]
    for o in (f"data.output_dir={root / 'prep'}", "evaluate.max_new_tokens=4", "evaluate.num_samples=0"):
        args += ["-S", o]
    return args


def test_evaluate_prints_and_records_the_fewshot_source(tiny_model, layout, monkeypatch, caplog, capsys):
    import mlflow

    monkeypatch.chdir(tiny_model)
    out = tiny_model / "out"
    # The CLI logs at INFO; Prefect's logging set-up may stop the record from reaching caplog's root handler.
    caplog.set_level(logging.INFO, logger="grpoflow.scoring")
    logger, lines = logging.getLogger("grpoflow.scoring"), LogLines()
    logger.addHandler(lines)
    try:
        assert cli.main(evaluate_args(tiny_model, f"jsonl:{layout}/gsm8k/test.jsonl", out)) == 0
    finally:
        logger.removeHandler(lines)
    train = f"jsonl:{layout}/gsm8k/train.jsonl"
    assert f"lm-eval-gsm8k few-shot examples: {train}, the train.jsonl beside the test file" in lines.messages
    printed = json.loads(capsys.readouterr().out)
    report = json.loads((out / "model.json").read_text())
    for metrics in (printed, report):
        assert metrics["fewshot_source"] == train and metrics["fewshot_split"] == "train"
        assert metrics["fewshot_rule"] == "the train.jsonl beside the test file"
    run = mlflow.get_run(printed["mlflow_run_id"])
    assert run.data.tags["grpoflow.eval.fewshot_source"] == train


def test_evaluate_refuses_data_without_a_train_split_before_any_run(tiny_model, layout, monkeypatch, capsys):
    import mlflow

    monkeypatch.chdir(tiny_model)
    data = f"jsonl:{layout}/lone/test.jsonl"
    assert cli.main(evaluate_args(tiny_model, data, tiny_model / "refused")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "evaluate.fewshot_source" in err[0] and data in err[0]
    assert mlflow.search_runs(search_all_experiments=True).empty and not (tiny_model / "refused").exists()
    # The same data with the source named: evaluated, the source recorded.
    args = (evaluate_args(tiny_model, data, tiny_model / "named")
            + ["-S", f"evaluate.fewshot_source=jsonl:{layout}/gsm8k/dev.jsonl"])
    assert cli.main(args) == 0
    report = json.loads((tiny_model / "named" / "model.json").read_text())
    assert report["fewshot_source"] == f"jsonl:{layout}/gsm8k/dev.jsonl"
    assert report["fewshot_rule"] == "set by evaluate.fewshot_source"
