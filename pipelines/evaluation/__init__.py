"""Evaluating any model outside the pipeline: `grpoflow evaluate` (a folder, a registered version or an endpoint)
and `grpoflow grade` (any system's completions)."""
