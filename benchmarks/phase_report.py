"""Phases that run guarded, within a time budget, into one JSON report (benchmarks/gpu_check.py).

    Check(out, budget, report, start).phase(where, name, work, *args, needs="")
                     runs work(*args) as a phase: its result (status ok, failed with the error line,
                     stopped when the budget ran out, or skipped) and its seconds and peak memory go
                     into where[name], and the report is written to out/gpu_check.json after each
    Check.alarm      the SIGALRM handler that stops the running phase at the budget (OutOfTime)
    Tee              a stream that also writes into the log file
"""

from __future__ import annotations

import gc
import json
import logging
import resource
import time
from pathlib import Path
from typing import Any

from benchmarks.grpo_step import figure
from components.common.files import write_text

log = logging.getLogger("grpoflow.gpu_check")


class OutOfTime(BaseException):  # noqa: N818 (not an error: a BaseException, so no `except Exception` in a library swallows it)
    """The time budget ran out (SIGALRM) during a phase."""


def error_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:500]


def rounded(value: Any) -> Any:
    """Floats at four significant figures (benchmarks/grpo_step.py figure), inside lists and dicts."""
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return figure(value) if isinstance(value, float) else value


def memory() -> dict[str, float]:
    """Peak memory since the last reset_peak: the GPU's allocations and reservations, or on a CPU the
    process's peak resident memory (the whole run's)."""
    import torch

    if torch.cuda.is_available():
        return {"peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
                "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3)}
    return {"peak_memory_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def release_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


class Check:
    """The report, written after every phase; phases run guarded and within the time budget."""

    def __init__(self, out: Path, budget: float, report: dict[str, Any], start: float):
        self.out, self.budget, self.report, self.start = out, budget, report, start
        self.out_of_time = False

    def alarm(self, signum: int, frame: Any) -> None:
        """SIGALRM's handler: the budget is spent, the running phase stops. The flag comes first: where
        Python ignores the exception (raised inside a `__del__` or a gc callback), the phase runs on to its
        end, and the phases after it are still skipped."""
        self.out_of_time = True
        raise OutOfTime()

    def write(self) -> None:
        self.report["elapsed_seconds"] = round(time.monotonic() - self.start, 1)
        write_text(self.out / "gpu_check.json", json.dumps(rounded(self.report), indent=2) + "\n")  # whole, atomic

    def phase(self, where: dict[str, Any], name: str, work, *args: Any, needs: str = "") -> bool:
        """Run `work(*args)` as phase `name`, its result in where[name], unless the budget is spent or
        the phase `needs` (in `where`) did not finish; False unless it finished."""
        if self.out_of_time:
            where[name] = {"status": "skipped", "note": f"the time budget of {self.budget:.0f} s ran out before it"}
        elif needs and where.get(needs, {}).get("status") != "ok":
            where[name] = {"status": "skipped", "note": f"needs the {needs} phase, which did not finish"}
        else:
            log.info("phase %s", name)
            release_memory()
            start = time.monotonic()
            try:
                result = {"status": "ok", **work(*args)}
            except OutOfTime:
                self.out_of_time = True
                result = {"status": "stopped", "note": f"the time budget of {self.budget:.0f} s ran out during it"}
            except Exception as exc:  # recorded, and the next phase runs
                log.exception("phase %s failed", name)
                result = {"status": "failed", "error": error_line(exc)}
            if result["status"] == "ok" and self.out_of_time:  # the alarm's exception was ignored
                result["note"] = f"finished after the time budget of {self.budget:.0f} s ran out"
            where[name] = {**result, "seconds": round(time.monotonic() - start, 1), **memory()}
            log.info("phase %s: %s in %.0f s", name, result["status"], where[name]["seconds"])
        self.write()
        return where[name]["status"] == "ok"


class Tee:
    """A stream that also writes to the log file."""

    def __init__(self, stream: Any, file: Any):
        self.stream, self.file = stream, file

    def write(self, text: str) -> int:
        self.file.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)
