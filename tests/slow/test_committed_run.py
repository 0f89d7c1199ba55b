"""A user's committed run leaves the project's files as they were: a copy of the session's baseline run
(tests/project_repo.py) completed with the rest of the project's files, as a clone where the pipeline ran,
then `git add -A && git commit` as a user commits a run; the file list check (tests/test_layout.py) passes on
it, and its project files (tests/project_files.py) are this checkout's.

    pytest -q -m slow tests/slow/test_committed_run.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.project_files import project_files, tracked_files
from tests.project_repo import git
from tests.test_layout import check_file_list

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


def test_a_committed_run_checks_as_the_project(baseline, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(baseline.repo, repo, symlinks=True)
    ours = project_files(REPO)
    for name in sorted(ours):
        if not (repo / name).exists():  # the run's params.yaml and DVC config stay the user's
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, repo / name)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the pipeline's run")

    committed = tracked_files(repo) - ours
    # what the run put in git: the lock file, the .gitignore beside a cached out, headline metrics, plot data
    assert {"dvc.lock", "data/selected/.gitignore", "reports/eval/metrics/grpo.json",
            "reports/train/grpo_history.csv"} <= committed, sorted(committed)
    assert project_files(repo) == ours
    check_file_list(repo)
