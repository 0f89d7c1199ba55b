"""grpoflow stage components: what runs inside a DVC stage.

The six stage modules sit at the top (data, model, sft, selection, grpo, evaluate), so this folder's
listing reads as the pipeline; each exposes `run(params)` (the whole stage, in its MLflow run) and
`main()`, and its dvc.yaml command is `python -m components.<stage>`. Their helpers sit in
subpackages by concern: common (errors, files, tracking, the entry point, the params schema),
problems, models, training and evaluation. Every module here is in some stage's dvc.yaml deps; what
only the flow or the CLI uses lives in pipelines/. Nothing here runs at import.
"""
