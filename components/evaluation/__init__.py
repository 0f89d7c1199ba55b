"""Evaluation helpers of the evaluate stage (and of selection's sampling): generation on vLLM, transformers or
an endpoint, scoring, statistics and reports."""
