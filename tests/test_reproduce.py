"""`grpoflow reproduce NAME VERSION` on a toy pipeline (tests/toy_repo.py): real git, DVC (repo,
dvc.lock, local remote), Prefect's temporary server for the flow that registers the versions, and
MLflow on SQLite. The real stages on small settings: tests/slow/test_reproduce_pipeline.py.

    pytest -q tests/test_reproduce.py
"""

from __future__ import annotations

import json

import pytest

from pipelines import cli
from pipelines.flow.pipeline import training_pipeline
from tests.toy_repo import make_tiny_model, make_toy_repo, write_toy_params


@pytest.fixture
def toy(tmp_path, monkeypatch):
    repo = make_toy_repo(tmp_path / "repo", make_tiny_model(tmp_path / "tiny"))
    monkeypatch.chdir(repo)  # grpoflow runs from the checkout
    return repo


def reproduce(*args: str) -> int:
    return cli.main(["reproduce", "grpoflow-policy", *args])


def runs_in(experiment: str = "grpoflow") -> int:
    import mlflow

    return len(mlflow.search_runs(experiment_names=[experiment], output_format="list"))


def test_reproduce_a_clean_version(toy, tmp_path, capsys):
    """From scratch and from the DVC cache: identical metrics and outputs, tracked in the copy; then
    a recorded metric that differs fails (exit 1, within --tolerance exit 0), a library version that
    differs is said up front, and missing pieces are errors that name them (exit 2)."""
    import mlflow

    assert reproduce("1") == 2
    assert "grpoflow-policy v1: not in the registry" in capsys.readouterr().err
    assert training_pipeline().registration.version == "1"
    before = runs_in()
    capsys.readouterr()

    work = tmp_path / "scratch" / "copy"
    assert reproduce("1", "--workdir", str(work)) == 0
    out = capsys.readouterr().out
    assert "nothing known that would keep it from reproducing exactly" in out
    assert "grpo/accuracy_strict" in out and "reproduced: 7 of 7 metrics identical" in out
    report = json.loads((work / "reproduce.json").read_text())
    assert report["ok"] and {r["status"] for r in report["metrics"]} == {"same"}
    assert set(report["outputs"].values()) == {"identical"}  # the toy's metrics hold no timings
    assert (work.parent / "grpo-runs.log").read_text().count("ran") == 1  # grpo re-ran, in the copy
    assert (work / ".git").is_dir() and (work / "toy.py").is_file()
    assert runs_in() == before and (work / "mlflow.db").is_file()  # tracked into the copy's own store

    cached = tmp_path / "cached" / "copy"
    assert reproduce("1", "--workdir", str(cached), "--from-cache") == 0
    out = capsys.readouterr().out
    assert "restoring the outputs from the DVC remote" in out and "reproduced: 7 of 7" in out
    assert not (cached.parent / "grpo-runs.log").exists()  # grpo's outputs came from the remote

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert reproduce("1", "--workdir", str(tmp_path / "full")) == 2
    assert "is not empty" in capsys.readouterr().err

    client = mlflow.MlflowClient()
    client.set_model_version_tag("grpoflow-policy", "1", "metric.grpo.accuracy_strict", "0.9")
    run_id = client.get_model_version("grpoflow-policy", "1").tags["lineage.pipeline_run_id"]
    client.set_tag(run_id, "grpoflow.version.torch", "0.0.1")  # as if trained with another torch
    client.log_metric(run_id, "grpo/accuracy_strict", 0.9)
    assert reproduce("1", "--workdir", str(tmp_path / "w1")) == 1
    out = capsys.readouterr().out
    up_front = out.split("working copy:")[0]
    assert "library versions differ" in up_front and "torch 0.0.1 (run)" in up_front
    assert "differs" in out and "not reproduced: 1 of 7" in out
    assert reproduce("1", "--workdir", str(tmp_path / "w2"), "--tolerance", "0.7") == 0  # 0.3 vs 0.9

    remote = toy.parent / "dvc-remote"
    for p in sorted(remote.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    capsys.readouterr()
    assert reproduce("1", "--workdir", str(tmp_path / "w3"), "--from-cache") == 2
    err = capsys.readouterr().err
    assert "DVC remote 'local'" in err and "missing or empty" in err


def test_a_dirty_tree_is_named_and_its_changes_are_not_reproduced(toy, tmp_path, capsys):
    write_toy_params(toy, skill=50)  # a change to a tracked file, not committed
    training_pipeline()
    capsys.readouterr()
    assert reproduce("1", "--workdir", str(tmp_path / "w")) == 1
    out = capsys.readouterr().out
    assert "the working tree was dirty at registration (lineage.git_dirty=true)" in out.split("working copy:")[0]
    assert "differs" in out
