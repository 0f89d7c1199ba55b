"""A throw-away checkout of this project with small settings, for end-to-end tests of real stages.

`make_project_repo(path, overrides)` copies the code (components/, dvc.yaml, params.yaml, the plot
templates in .dvc/plots/) into a fresh git + DVC repository with a local DVC remote, applies SMALL
(settings that train and evaluate in about a minute on a CPU) and `overrides` to its params.yaml,
and commits. The pipeline then runs
there with `python -m pipelines.cli run` (cwd = the copy), exactly as a user's checkout would.

The slow tier shares one finished run (`Baseline`, built once per test session by the `baseline`
fixture in tests/conftest.py): scenarios that only read it use it as it is; scenarios that change
it work on `baseline.copy(path)`, a copy of the checkout, its DVC remote and its MLflow store
together.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def preset_overrides(name: str) -> list[str]:
    from pipelines.params import presets

    return presets.overrides(name)


# The tiny model (`--preset tiny`), at sizes that train and evaluate in about a minute.
SMALL = [
    *preset_overrides("tiny"),
    "data.synthetic_train_size=200",
    "data.synthetic_test_size=40",
    "data.synthetic_answer_only_size=80",
    "model.tiny_hidden_size=64",
    "model.tiny_intermediate_size=128",
    "model.tiny_num_heads=2",
    "model.tiny_num_layers=1",
    "sft.trainer.max_steps=30",
    "sft.trainer.per_device_train_batch_size=8",
    "sft.trainer.save_steps=10",
    "sft.trainer.logging_steps=5",
    "sft.sample_size=2",
    "selection.max_candidates=40",
    "selection.num_samples=2",
    "selection.keep_unsolved=true",  # a 30-step SFT model solves (almost) nothing
    "selection.min_prompts=4",
    "selection.max_new_tokens=24",
    "selection.backend=transformers",
    "grpo.trainer.max_steps=2",
    "grpo.trainer.per_device_train_batch_size=8",
    "grpo.trainer.max_completion_length=24",
    "grpo.trainer.logging_steps=1",
    "grpo.sample_size=2",
    "grpo.dev_size=0",  # the GRPO dev curve has its own test (tests/test_grpo_dev.py)
    "evaluate.backend=transformers",
    "evaluate.max_new_tokens=24",
]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def make_project_repo(path: Path, overrides: list[str] = (), with_flows: bool = False) -> Path:
    """The checkout; `with_flows` adds pipelines/ and infra/prefect.yaml (to deploy from it)."""
    from pipelines.params.config import write_overrides

    path.mkdir(parents=True)
    for package in ("components", "pipelines") if with_flows else ("components",):
        shutil.copytree(REPO / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
    if with_flows:
        (path / "infra").mkdir()
        shutil.copy(REPO / "infra" / "prefect.yaml", path / "infra" / "prefect.yaml")
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(REPO / name, path / name)
    write_overrides(path / "params.yaml", [*SMALL, *overrides])
    git(path, "init", "-q")
    git(path, "config", "user.email", "test@example.com")
    git(path, "config", "user.name", "test")
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=path, check=True)
    shutil.copytree(REPO / ".dvc" / "plots", path / ".dvc" / "plots")  # dvc.yaml's plot templates
    subprocess.run([sys.executable, "-m", "dvc", "remote", "add", "-d", "store", str(path.parent / "dvc-remote")],
                   cwd=path, check=True, capture_output=True)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "test checkout")
    return path


def grpoflow(repo: Path, *args: str, log: Path | None = None, **kw) -> subprocess.Popen:
    """`grpoflow ARGS` in the checkout, output to `log` (default: a pipe)."""
    out = open(log, "w") if log else subprocess.PIPE  # noqa: SIM115 (the caller's process owns it)
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=repo, stdout=out,
                            stderr=subprocess.STDOUT, text=True, **kw)


def wait_for(condition, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None,
             poll: float = 0.5) -> None:
    """Wait until `condition()` is true, at most `timeout` seconds; fail naming `what` (with the log's tail),
    or at once if `proc` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} after {timeout:.0f} s:\n{tail}")
        time.sleep(poll)


def pipeline_env(state: Path, **extra: str) -> dict[str, str]:
    """The environment of a `grpoflow` process on a checkout: tracking on the checkout's own store
    (params tracking.uri, as a user's run), Prefect's temporary server with its home under `state`."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PYTHONPATH", "PREFECT_API_URL")}
    env.update(PREFECT_HOME=str(state / "prefect"), DVC_SITE_CACHE_DIR=str(state / "dvc-site-cache"),
               HF_HOME=str(state / "hf"), **extra)
    # dvc.yaml's stage commands run `python` from PATH: this interpreter's, as `make` puts .venv/bin first.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def run_ok(repo: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 1800) -> str:
    """`grpoflow ARGS` in the checkout to completion; its output, or the tail of it in the failure."""
    proc = grpoflow(repo, *args, env=env)
    out, _ = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        log = repo.parent / f"grpoflow-{args[0]}-failed.log"
        log.write_text(out)
        errors = "\n".join(line for line in out.splitlines() if "error" in line.lower() or "failed" in line.lower())
        raise AssertionError(f"grpoflow {' '.join(args)} exited {proc.returncode} (whole output: {log}); "
                             f"its error lines:\n{errors[-3000:]}\nits end:\n{out[-3000:]}")
    return out


def process_table() -> list[tuple[int, str, str]]:
    """(pid, cwd, command line) of every live, non-zombie process this user can read."""
    rows = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cwd = os.readlink(entry / "cwd")
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if state != "Z":
                rows.append((int(entry.name), cwd, cmd))
    return rows


def stage_processes(repo: Path) -> list[int]:
    """Live `dvc` and stage processes (python -m components.<stage>) working in the checkout."""
    return [pid for pid, cwd, cmd in process_table()
            if (cwd == str(repo) or cwd.startswith(f"{repo}/")) and ("-m dvc" in cmd or "-m components." in cmd)]


def prefect_servers(prefect_home: Path) -> list[int]:
    """Live Prefect API servers started by a run whose PREFECT_HOME is `prefect_home` (read from their
    environment: the temporary server is a child process that inherits it)."""
    pids = []
    for pid, _cwd, cmd in process_table():
        if "prefect.server.api" not in cmd and "prefect server" not in cmd:
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PREFECT_HOME={prefect_home}".encode() in environ:
            pids.append(pid)
    return pids


@dataclass(frozen=True)
class Baseline:
    """A finished small pipeline run: `root` holds the checkout (`repo`), its DVC remote and the state of
    the run (Prefect home, caches); the MLflow store is the checkout's own (mlflow.db, mlartifacts/);
    `output` is what `grpoflow run` printed."""

    root: Path
    output: str

    @property
    def repo(self) -> Path:
        return self.root / "repo"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.repo / 'mlflow.db'}"

    def env(self, **extra: str) -> dict[str, str]:
        return pipeline_env(self.root, **extra)

    def copy(self, dest: Path) -> Baseline:
        """A copy that changes nothing of this one: checkout, DVC remote and MLflow store (whose artifact
        locations are absolute paths, rewritten to the copy's)."""
        shutil.copytree(self.root, dest, symlinks=True, ignore=shutil.ignore_patterns("prefect", "dvc-site-cache"))
        repo = dest / "repo"
        subprocess.run([sys.executable, "-m", "dvc", "remote", "modify", "--local", "store", "url",
                        str(dest / "dvc-remote")], cwd=repo, check=True, capture_output=True)
        old, new = str(self.root), str(dest)
        with sqlite3.connect(repo / "mlflow.db") as db:
            for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
                for column in db.execute(f"PRAGMA table_info('{table}')").fetchall():
                    if column[2].upper() in ("TEXT", "VARCHAR") or column[2].upper().startswith("VARCHAR"):
                        db.execute(f'UPDATE "{table}" SET "{column[1]}" = replace("{column[1]}", ?, ?) '
                                   f'WHERE "{column[1]}" LIKE ?', (old, new, f"%{old}%"))
        return Baseline(dest, self.output)


# The slow tier's baseline run: SMALL, evaluated on the default engine (vLLM when .venv-vllm exists, linked
# into the checkout as in a user's; else transformers) with a few seeded samples per problem.
BASELINE_OVERRIDES = ["evaluate.backend=auto", "evaluate.num_samples=2", "evaluate.max_new_tokens=48"]


def make_baseline(root: Path) -> Baseline:
    """Run the pipeline once on a small checkout under `root` (about 3-5 minutes on two cores)."""
    repo = make_project_repo(root / "repo", BASELINE_OVERRIDES)
    if (REPO / ".venv-vllm").exists():
        (repo / ".venv-vllm").symlink_to((REPO / ".venv-vllm").resolve(), target_is_directory=True)
    output = run_ok(repo, "run", env=pipeline_env(root), timeout=3600)
    return Baseline(root, output)

