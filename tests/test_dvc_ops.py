"""pipelines/dvc_ops.push and pull on a real DVC repo and folder remote: git-tracked (`cache: false`)
outputs travel through the remote too, which `dvc push`/`dvc pull` alone leave out (regression: a
second clone re-ran such stages, and a stage run on a work pool came back without its metrics)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipelines.execution import dvc_ops

STAGE = """\
stages:
  make:
    cmd: python make.py
    deps: [make.py]
    outs: [out/data.txt]
    metrics:
      - out/stats.json:
          cache: false
"""
SCRIPT = """\
import json, os
os.makedirs("out", exist_ok=True)
open("out/data.txt", "w").write("data\\n")
json.dump({"n": 3}, open("out/stats.json", "w"))
"""


def _env(tmp_path: Path) -> dict[str, str]:
    repo_root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(tmp_path / "site"),
            "PYTHONPATH": repo_root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def sh(cwd: Path, env: dict[str, str], *cmd: str) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_git_tracked_outputs_travel_through_the_remote(tmp_path):
    env = _env(tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    (first / "dvc.yaml").write_text(STAGE)
    (first / "make.py").write_text(SCRIPT)
    dvc = [sys.executable, "-m", "dvc"]
    sh(first, env, "git", "init", "-q")
    sh(first, env, *dvc, "init", "-q")
    sh(first, env, *dvc, "remote", "add", "-d", "store", str(tmp_path / "remote"))
    sh(first, env, "git", "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    sh(first, env, "git", "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "init")
    sh(first, env, *dvc, "repro", "make")
    rc, out = dvc_ops.push(first, env)
    assert rc == 0 and "1 git-tracked output(s) pushed" in out, out

    # A clone with the stage's lock entry (as the flow merges it after a work pool ran the stage).
    sh(tmp_path, env, "git", "clone", "-q", str(first), str(second))
    (second / "dvc.lock").write_text((first / "dvc.lock").read_text())
    rc, out = dvc_ops.pull(second, env, ["make"])
    assert rc == 0, out
    assert json.loads((second / "out/stats.json").read_text()) == {"n": 3}
    assert (second / "out/data.txt").read_text() == "data\n"

    # And through the run cache: a clone without dvc.lock restores the stage instead of running it.
    third = tmp_path / "third"
    sh(tmp_path, env, "git", "clone", "-q", str(first), str(third))
    sh(third, env, *dvc, "pull", "--run-cache", "--allow-missing")
    assert "is cached - skipping run" in sh(third, env, *dvc, "repro", "--pull", "make")
    assert json.loads((third / "out/stats.json").read_text()) == {"n": 3}


def test_stage_order_follows_dvc_yaml_edits_within_one_process(tmp_path):
    """The order is read once per content of dvc.yaml and params.yaml (the run's pre-flight check and
    the flow share it), but an edit, even one of the same size, gives the new graph."""
    repo = tmp_path / "repo"
    repo.mkdir()
    env = _env(tmp_path)
    sh(repo, env, "git", "init", "-q")
    sh(repo, env, sys.executable, "-m", "dvc", "init", "-q")
    two = STAGE + "  use:\n    cmd: cat out/data.txt\n    deps: [out/data.txt]\n"
    (repo / "dvc.yaml").write_text(two)
    (repo / "params.yaml").write_text("a: 1\n")
    assert dvc_ops.stage_order(repo) == ["make", "use"]
    (repo / "dvc.yaml").write_text(two.replace("  use:", "  zap:"))  # same size, new name
    assert dvc_ops.stage_order(repo) == ["make", "zap"]
    first = "stages:\n  late:\n    cmd: cat out/data.txt\n    deps: [out/data.txt]\n" + STAGE.split("\n", 1)[1]
    (repo / "dvc.yaml").write_text(first)  # the dependent stage first in the file: the graph still puts it last
    assert dvc_ops.stage_order(repo) == ["make", "late"]
