"""`grpoflow sweep`'s spec: what a spec file and `-S key=a,b,c` become, and the bad specs refused in one line
naming the field, exit 2, before anything runs (pipelines/params/sweep_spec.py, pipelines/flow/sweep_search.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from components.common.errors import ConfigError
from pipelines.flow.sweep_search import Journal, ask_tpe, grid, random_config
from pipelines.params.sweep_spec import read_spec

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"


def spec_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return str(path)


def test_a_spec_file_becomes_a_grid_of_configurations_each_run_on_every_seed(tmp_path):
    spec = read_spec(spec_file(tmp_path, """
parameters:
  grpo.trainer.beta: [0.0, 0.1]
  grpo.trainer.learning_rate: {values: [1.0e-5, 5.0e-5]}
seeds: {key: data.seed, values: [1234, 7]}
parallel: 2
"""), [], PARAMS)
    assert (spec.method, spec.seed_key, spec.seeds, spec.parallel) == ("grid", "data.seed", (1234, 7), 2)
    assert spec.metric == "target.accuracy_checked"  # the default: the target band's checked accuracy
    assert grid(spec) == [{"grpo.trainer.beta": b, "grpo.trainer.learning_rate": lr}
                          for b in (0.0, 0.1) for lr in (1e-5, 5e-5)]


def test_inline_values_separated_by_commas_are_a_grid_and_a_single_value_a_fixed_override():
    spec = read_spec(None, ["grpo.trainer.beta=0.0,0.04,0.1", "grpo.trainer.max_steps=4"], PARAMS, trials=2)
    assert [p.key for p in spec.parameters] == ["grpo.trainer.beta"]
    assert grid(spec) == [{"grpo.trainer.beta": 0.0}, {"grpo.trainer.beta": 0.04}]  # the trial cap: 2 of 3
    assert spec.overrides == ("grpo.trainer.max_steps=4",)


def test_random_draws_and_tpe_asks_stay_inside_their_ranges(tmp_path):
    text = ("parameters:\n  grpo.trainer.learning_rate: {low: 1.0e-6, high: 1.0e-3, log: true}\n"
            "  grpo.trainer.beta: {low: 0.0, high: 0.2}\nmethod: random\ntrials: 6\nseed: 3\n")
    spec = read_spec(spec_file(tmp_path, text), [], PARAMS)
    draws = [random_config(spec, i) for i in range(spec.configurations)]
    assert len(draws) == 6 and draws == [random_config(spec, i) for i in range(6)]  # the same on a rerun
    assert all(1e-6 <= d["grpo.trainer.learning_rate"] <= 1e-3 and 0 <= d["grpo.trainer.beta"] <= 0.2 for d in draws)
    asked = ask_tpe(spec, [(d, i / 10) for i, d in enumerate(draws)], 2)
    assert len(asked) == 2 and all(1e-6 <= a["grpo.trainer.learning_rate"] <= 1e-3 for a in asked)


BAD = {
    "unknown key": ("parameters:\n  grpo.trainer.bta: [0.1]\n  grpo.betta: [0.1]\n", "parameters.grpo.betta"),
    "empty range": ("parameters:\n  grpo.trainer.beta: {low: 0.2, high: 0.1}\nmethod: random\ntrials: 2\n",
                    "parameters.grpo.trainer.beta: empty range"),
    "empty list": ("parameters:\n  grpo.trainer.beta: []\n", "parameters.grpo.trainer.beta: empty list"),
    "type mismatch": ("parameters:\n  grpo.trainer.beta: [0.1, high]\n", "parameters.grpo.trainer.beta: 'high'"),
    "an integer key given a fraction": ("parameters:\n  grpo.trainer.max_steps: [2, 2.5]\n",
                                        "parameters.grpo.trainer.max_steps: 2.5"),
    "a value the params' checks refuse": ("parameters:\n  grpo.dev_every: [0, 5]\n", "parameters.grpo.dev_every"),
    "unknown spec key": ("parameters:\n  grpo.trainer.beta: [0.1]\nparalel: 2\n", "paralel: unknown key"),
    "unknown method": ("parameters:\n  grpo.trainer.beta: [0.1]\nmethod: bayes\n", "method: 'bayes'"),
    "a range in a grid": ("parameters:\n  grpo.trainer.beta: {low: 0.0, high: 0.1}\n",
                          "parameters.grpo.trainer.beta: a grid needs a list"),
    "unknown seed key": ("parameters:\n  grpo.trainer.beta: [0.1]\nseeds: {key: data.sed, values: [1, 2]}\n",
                         "seeds.key: data.sed"),
    "unknown metric": ("parameters:\n  grpo.trainer.beta: [0.1]\nmetric: target.loss\n", "metric: 'target.loss'"),
    "more parallel trials than cores": ("parameters:\n  grpo.trainer.beta: [0.1]\nparallel: 4096\n", "parallel: 4096"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_spec_is_one_line_naming_the_field_exit_2_and_nothing_runs(case, tmp_path, monkeypatch, capsys):
    text, expected = BAD[case]
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("params.yaml", "dvc.yaml"):
        shutil.copy(REPO / name, repo / name)
    monkeypatch.chdir(repo)
    from pipelines.cli import main

    assert main(["sweep", spec_file(tmp_path, text)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {expected}") and "\n" not in err, err
    assert not (repo / ".dvc").exists() and not (repo / "mlflow.db").exists()  # no journal, no run


def test_a_journal_written_by_two_writers_keeps_every_line_and_refuses_another_spec_under_its_name(tmp_path):
    first, second = Journal(tmp_path / "s"), Journal(tmp_path / "s")
    assert first.start("spec-a", lambda: "run-1") == "run-1"
    assert second.start("spec-a", lambda: "never") == "run-1"  # a rerun continues the same parent run
    for i in range(20):
        (first if i % 2 else second).append({"event": "trial", "index": i, "seed": 0, "status": "finished"})
    with open(first.path, "a") as f:
        f.write('{"event": "trial", "ind')  # a line cut by a crash mid-write
    assert len(second.trials()) == 20
    with pytest.raises(ConfigError, match="name: sweep 's' was started with another spec"):
        second.start("spec-b", lambda: "run-2")


def test_the_docs_example_spec_reads_as_documented(tmp_path):
    """docs/sweep.md's spec (its yaml block) is a valid spec: a 2 x 2 grid on two data seeds."""
    import re

    text = re.search(r"```yaml\n(.*?)```", (REPO / "docs" / "sweep.md").read_text(), re.S).group(1)
    spec = read_spec(spec_file(tmp_path, text), [], PARAMS)
    assert (spec.name, spec.method, spec.seeds, spec.dev_size, spec.configurations) == (
        "lr-beta", "grid", (1234, 2024), 32, 4)
