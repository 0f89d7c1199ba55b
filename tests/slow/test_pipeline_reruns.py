"""What re-runs after a finished run, asked of DVC itself on a copy of the session's baseline run
(tests/project_repo.py): a word appended to every param's help text leaves `dvc status` clean, and a
comment appended to any module a stage imports makes `dvc status` report exactly the stages that import
it, directly or not, as pipelines/execution/stage_deps.py derives them from the code (the fast tier checks
that dvc.yaml lists them; this checks that DVC re-runs them).

    pytest -q tests/slow/test_pipeline_reruns.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from pipelines.execution.stage_deps import reruns
from tests.project_repo import REPO
from tests.test_config import append_to_every_help_entry

pytestmark = pytest.mark.slow


def test_help_text_reruns_nothing_and_a_module_comment_exactly_its_stages(baseline, tmp_path):
    copy = baseline.copy(tmp_path / "copy")
    repo, env = copy.repo, copy.env()

    def status() -> dict:
        proc = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=repo, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    assert status() == {}
    # A user's clone holds pipelines/ too (the baseline's checkout runs the installed one).
    shutil.copytree(REPO / "pipelines", repo / "pipelines", ignore=shutil.ignore_patterns("__pycache__"),
                    dirs_exist_ok=True)
    append_to_every_help_entry(repo / "params.yaml", "indeed")
    assert status() == {}

    expected = reruns(repo)  # from the imports of the copy's code
    assert len(expected) > 40 and expected["components/training/rewards.py"] == {"grpo"}
    rerun = {}
    for module in sorted(expected):
        path = repo / module
        original = path.read_bytes()
        path.write_bytes(original + b"# a comment\n")
        rerun[module] = set(status())
        path.write_bytes(original)
    assert rerun == expected
    assert status() == {}
