"""grpoflow stage components: one module per pipeline stage plus shared pieces.

Each stage module exposes a pure `run(...)` and a `main()` so that its dvc.yaml
command is `python -m components.<module>`. Nothing here runs at import.
"""
