"""The gate stopped after every one of its writes (the server lost, tests/test_registry_retry.py samples
them): each rerun completes the gate, and the registry ends as after an uninterrupted gate.

    pytest -q tests/slow/test_registry_retry_all.py
"""

from __future__ import annotations

import pytest

from tests.test_registry_retry import lost_after, registry, server, state, writes_of  # noqa: F401

pytestmark = pytest.mark.slow


def test_the_gate_stopped_after_each_of_its_writes_is_completed_by_its_rerun(registry, tmp_path, capsys):  # noqa: F811
    client, fwd, box = registry
    n, expected = writes_of(client, box, "gate", tmp_path)
    for k in range(1, n):
        line = lost_after(client, fwd, box, "gate", k, tmp_path, capsys)
        assert state(client, f"gate-{k}") == expected, (k, line)
