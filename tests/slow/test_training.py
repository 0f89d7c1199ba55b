"""Tiny-model end-to-end training: the model stage and a few SFT and GRPO steps that change
the weights and log to MLflow, LoRA saved as an adapter, a GRPO run killed after its first
checkpoint that resumes, stale checkpoints not resumed, and stages that fail early on bad
configs or a missing model.

SFT runs once (module fixture) on a tiny model (1 layer, 32 wide) and 48 synthetic
problems; each GRPO test works on a copy of that folder. About two minutes on two cores.

    pytest -q tests/slow/test_training.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from components import model as model_stage
from components.models.modelio import is_model_dir
from pipelines.params.config import load_params

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

TINY_PARAMS = {
    "model": {
        "tiny_hidden_size": 32,
        "tiny_intermediate_size": 64,
        "tiny_num_layers": 1,
        "tiny_num_heads": 2,
        "tiny_vocab_size": 300,
    },
    "sft": {
        "sample_size": 4,
        "demo_untagged_rate": 0.5,  # noisy demonstrations, asked for (the default is every one tagged)
        "demo_wrong_rate": 0.2,
        "trainer": {
            "max_steps": 4,
            "per_device_train_batch_size": 4,
            "learning_rate": 1.0e-3,
            "logging_steps": 2,
            "save_steps": 2,
            "seed": 0,
        },
    },
    "grpo": {
        "sample_size": 4,
        "trainer": {
            "num_generations": 4,
            "max_steps": 4,
            "per_device_train_batch_size": 8,
            "learning_rate": 1.0e-3,
            "max_completion_length": 24,
            "logging_steps": 2,
            "save_steps": 2,
            "seed": 0,
        },
    },
    # A tiny model after 4 SFT steps earns no format or accuracy reward: with all rewards equal,
    # advantages are zero and GRPO would not move. The length reward (a user reward loaded by
    # its dotted path) varies within every group.
    "rewards": {"funcs": ["format", "accuracy", "toyrewards:length"], "weights": [0.5, 1.0, 0.1]},
}
TOY_REWARDS = """
def length(completions, **kwargs):
    return [min(len(c), 100) / 100 for c in completions]
"""


def _env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(workdir), env.get("PYTHONPATH", "")])
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{workdir / 'mlflow.db'}"
    return env


def stage(workdir: Path, module: str, *overrides: str, check: bool = True, python: str | Path = sys.executable,
          env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m components.<module>` in `workdir` like DVC does (`python`: another venv's; `env`: more
    variables)."""
    args = [str(python), "-m", f"components.{module}", "--params", "params.yaml"]
    for o in overrides:
        args += ["-S", o]
    proc = subprocess.run(args, cwd=workdir, env={**_env(workdir), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{module} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def tiny_params(params: dict) -> dict:
    """`params` over the tiny preset's (the tiny model and its recipe), section by section, key by key."""
    from pipelines.params import presets

    def merge(base: dict, top: dict) -> dict:
        return {**base, **{k: merge(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                           for k, v in top.items()}}

    return merge(presets.read("tiny")["params"], params)


def make_workdir(path: Path) -> Path:
    """A folder with params.yaml (tiny settings), data/processed and models/base."""
    from components.data import write_splits as prepare
    from pipelines.params.config import DataParams

    (path / "params.yaml").write_text(yaml.safe_dump(tiny_params(TINY_PARAMS)))
    (path / "toyrewards.py").write_text(TOY_REWARDS)
    cwd = os.getcwd()
    os.chdir(path)
    try:
        prepare(DataParams(synthetic_train_size=48, synthetic_test_size=8, synthetic_test_top_band_size=0, seed=3))
        params = load_params("params.yaml")
        model_stage.build_base(params.model, Path("data/processed/train.jsonl"))
    finally:
        os.chdir(cwd)
    return path


@pytest.fixture(scope="module")
def sft_workdir(tmp_path_factory) -> Path:
    """A workdir where the SFT stage has run (4 steps); tests take copies of it."""
    workdir = make_workdir(tmp_path_factory.mktemp("sft"))
    stage(workdir, "sft")
    stage(workdir, "selection", "selection.num_samples=0", "selection.min_prompts=1")  # GRPO's prompts
    return workdir


@pytest.fixture
def workdir(sft_workdir: Path, tmp_path: Path) -> Path:
    """A private copy of the SFT workdir."""
    copy = tmp_path / "work"
    shutil.copytree(sft_workdir, copy)
    return copy


@pytest.fixture(scope="module")
def shared_workdir(tmp_path_factory) -> Path:
    """A workdir without any trained model, for the tests that must not write anything."""
    return make_workdir(tmp_path_factory.mktemp("bad-configs"))


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def changed(a: dict, b: dict) -> list[str]:
    import torch

    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def mlflow_run(workdir: Path, name: str):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grpoflow")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.mlflow.runName = '{name}'")
    assert runs, f"no MLflow run named {name}"
    return client, runs[0]


def test_sft_changes_the_weights_and_logs(sft_workdir: Path):
    base, sft = weights(sft_workdir / "models/base"), weights(sft_workdir / "models/sft")
    assert len(changed(base, sft)) == len(base)  # every tensor moved
    report = json.loads((sft_workdir / "reports/train/sft.json").read_text())
    assert report["global_step"] == 4 and report["demos"] == 48 and report["resumed_from"] is None
    assert report["demos_untagged"] > 0 and report["demos_wrong"] > 0
    assert not (sft_workdir / "checkpoints/sft").exists()  # deleted after the save
    client, run = mlflow_run(sft_workdir, "sft")
    assert run.info.status == "FINISHED"
    assert {"loss", "learning_rate", "demos_wrong", "sample_accuracy"} <= set(run.data.metrics)
    assert run.data.params["sft.demo_untagged_rate"] == "0.5"
    assert "sft_samples.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_grpo_changes_the_weights_and_logs(workdir: Path):
    # a signal-monitor window of one log and no KL allowed: the kl_drift warning must reach the run
    out = stage(workdir, "grpo", "grpo.signal_window=2", "grpo.signal_max_kl=0")
    assert "Downloading artifacts" not in out.stdout + out.stderr  # the completions' logging downloads nothing
    assert changed(weights(workdir / "models/sft"), weights(workdir / "models/grpo"))
    assert json.loads((workdir / "reports/train/grpo.json").read_text())["global_step"] == 4

    client, run = mlflow_run(workdir, "grpo")
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    for key in (
        "loss",
        "kl",
        "reward",
        "reward_std",
        "frac_reward_zero_std",
        "learning_rate",
        "rewards/format_reward/mean",
        "rewards/accuracy_reward/std",
        "rewards/length/mean",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "sample_accuracy",
        "frac_reward_zero_std_mean",
        "signal_warnings",
        "signal_warning_kl_drift",
    ):
        assert key in metrics, key
    assert "drifting" in run.data.tags["grpoflow.grpo.signal_warning"]
    assert run.data.params["grpo.trainer.beta"] == "0.04" and run.data.params["loss_type"] == "grpo"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"completions", "grpo_samples.json", "grpo_signal_warnings.txt"} <= artifacts
    first = client.list_artifacts(run.info.run_id, "completions")[0].path  # one file per generation batch
    table = json.loads(Path(client.download_artifacts(run.info.run_id, first)).read_text())
    assert {"step", "prompt", "completion", "reward_format_reward", "advantage"} <= set(table["columns"])


def test_lora_grpo_writes_an_adapter_over_the_full_sft_model_and_ignores_stale_checkpoints(workdir: Path):
    from components.models import adapters
    from components.training import finetune

    # A crash left a checkpoint made with other params: it must not be resumed.
    ckpt = workdir / "checkpoints/grpo"
    finetune.resume_point(ckpt, "made-with-other-params", True, "grpo")
    (ckpt / "checkpoint-2").mkdir()
    (ckpt / "checkpoint-2" / "trainer_state.json").write_text("{}")

    out = stage(workdir, "grpo", "grpo.use_lora=true", "grpo.lora.r=4", "grpo.trainer.max_steps=2")
    assert "starting over" in out.stderr and "resuming from checkpoint" not in out.stderr
    grpo_dir = workdir / "models/grpo"
    assert adapters.is_adapter_dir(grpo_dir) and not is_model_dir(grpo_dir)
    assert adapters.base_of(grpo_dir).base_dir == "models/sft"  # the full SFT model is the adapter's base
    merged = adapters.merge(grpo_dir, workdir / "models/sft", workdir / "merged")
    assert weights(merged).keys() == weights(workdir / "models/sft").keys()
    assert changed(weights(workdir / "models/sft"), weights(merged))


def test_killed_grpo_resumes_from_its_checkpoint(workdir: Path):
    before = (workdir / "models/sft/model.safetensors").read_bytes()
    overrides = ["grpo.trainer.max_steps=12", "grpo.trainer.save_steps=2"]
    cmd = [sys.executable, "-m", "components.grpo", "--params", "params.yaml"]
    for o in overrides:
        cmd += ["-S", o]
    proc = subprocess.Popen(
        cmd, cwd=workdir, env=_env(workdir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    first = workdir / "checkpoints/grpo/checkpoint-2/trainer_state.json"
    deadline = time.monotonic() + 300
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert first.exists(), "no checkpoint appeared before the run ended"
    assert not (workdir / "models/grpo").exists()  # nothing half-written
    done = sorted(int(p.name.split("-")[1]) for p in (workdir / "checkpoints/grpo").glob("checkpoint-*"))
    assert done and max(done) < 12, "the run finished before it was killed"

    again = stage(workdir, "grpo", *overrides)
    assert "grpo: resuming from checkpoint" in again.stderr
    report = json.loads((workdir / "reports/train/grpo.json").read_text())
    assert report["global_step"] == 12
    assert report["resumed_from"].endswith(tuple(f"checkpoint-{s}" for s in done))
    assert (workdir / "models/sft/model.safetensors").read_bytes() == before
    # A finished stage leaves no checkpoints behind: the next run starts from scratch.
    assert not (workdir / "checkpoints/grpo").exists()


@pytest.mark.parametrize(
    "module,overrides,message",
    [
        ("grpo", ["grpo.trainer.loss_type=ppo"], "grpo.trainer.loss_type: expected one of"),
        ("grpo", ["grpo.trainer.per_device_train_batch_size=6"], "not divisible by num_generations=4"),
        ("grpo", ["grpo.init_dir=models/nope"], "SFT model folder models/nope is missing"),
        ("grpo", ["rewards.funcs=[nope]", "rewards.weights=[1]"], "nope"),
        ("grpo", ["grpo.trainer.importance_sampling_levl=sequence"], "not a field of trl.GRPOConfig"),
        ("sft", ["sft.trainer.lr_scheduler_type=zigzag"], "sft.trainer: trl.SFTConfig rejected"),
        ("sft", ["model.base_dir=models/nope"], "base model folder models/nope is missing"),
    ],
)
def test_bad_configs_fail_early_with_a_clear_message(shared_workdir: Path, module, overrides, message):
    workdir = shared_workdir
    proc = stage(workdir, module, *overrides, check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert message in proc.stderr
    # Failed before training: no checkpoint folder was made, no model written.
    assert not (workdir / "models/grpo").exists() and not (workdir / "checkpoints").exists()
