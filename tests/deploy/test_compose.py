"""deploy/compose.yaml: valid against the Compose Specification schema (no Docker engine
needed), every command it runs exists here, migrations run once before the app, the worker
gets the GPUs; and the app image's entrypoint aliases name real commands."""

import json
import os
import re
import subprocess

import jsonschema
import pytest
import yaml

from tests.deploy.commands import problems, repo_path
from tests.deploy.conftest import DEPLOY, ROOT

APP_SERVICES = {"migrate", "web", "worker", "beat", "scheduler"}


def shared_schema(name: str):
    """../shared/schemas/<name> beside the repository (CI), or beside an ancestor (worktrees)."""
    for base in [ROOT, *ROOT.parents]:
        candidate = base.parent / "shared" / "schemas" / name
        if candidate.is_file():
            return json.loads(candidate.read_text())
    pytest.fail(f"../shared/schemas/{name} not found beside {ROOT} or any parent")


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_matches_the_compose_specification(compose):
    validator = jsonschema.Draft7Validator(shared_schema("compose-spec.json"))
    errors = sorted(validator.iter_errors(compose), key=lambda error: list(error.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_schema_check_catches_a_mistake(compose):
    """Negative control: a misspelt key is refused, so the test above can fail."""
    broken = {**compose, "services": {**compose["services"], "web": {**compose["services"]["web"], "comand": ["x"]}}}
    assert list(jsonschema.Draft7Validator(shared_schema("compose-spec.json")).iter_errors(broken))


def test_every_command_exists(compose):
    found = {}
    for name, service in compose["services"].items():
        if name not in APP_SERVICES:
            continue
        assert service["image"].startswith("${GPUBOOK_IMAGE:-gpubook-app:")
        assert service["build"]["dockerfile"] == "deploy/images/app.Dockerfile"
        found[name] = problems(service["command"])
        test = service.get("healthcheck", {}).get("test")
        if test:
            kind, *argv = test
            found[f"{name} healthcheck"] = problems(argv[0].replace("$$", "$") if kind == "CMD-SHELL" else argv)
    assert set(found) >= APP_SERVICES
    assert not any(found.values()), found
    # The health check script ships in the image (it is in the build context).
    assert repo_path("/app/deploy/images/healthcheck.py").is_file()
    assert "!deploy/images/healthcheck.py" in (DEPLOY / "images" / "app.Dockerfile.dockerignore").read_text()


def test_migrations_run_once_before_the_app(compose):
    services = compose["services"]
    assert services["migrate"]["command"][2] == "migrate"
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
    assert {"test", "interval"} <= set(services["postgres"]["healthcheck"])
    assert {"test", "interval"} <= set(services["web"]["healthcheck"])


def test_volumes_gpus_and_environment(compose):
    services = compose["services"]
    assert {"pgdata", "runs", "data", "var"} <= set(compose["volumes"])
    assert "pgdata:/var/lib/postgresql/data" in services["postgres"]["volumes"]
    assert services["worker"]["gpus"] == "all"  # the local executor's runs use the host's GPUs
    assert "runs:/srv/gpubook/runs" in services["worker"]["volumes"]
    assert services["web"]["ports"] == ["127.0.0.1:8000:8000"]  # the TLS proxy is in front
    env = services["web"]["environment"]
    assert env["SECRET_KEY"].startswith("${SECRET_KEY:?")  # no default secret
    assert services["web"]["env_file"][0]["path"] == "${GPUBOOK_ENV_FILE:-production.env}"
    assert (DEPLOY / "production.env").is_file()
    # The embedded loop is opt-in: running it beside worker + beat would drive runs twice.
    assert services["scheduler"]["profiles"] == ["embedded"]


@pytest.mark.parametrize("alias", ["web", "worker", "beat", "scheduler", "gpu_agent", "migrate"])
def test_entrypoint_aliases_name_real_commands(alias):
    result = subprocess.run(
        [str(DEPLOY / "images" / "app-entrypoint.sh"), alias],
        env={"PATH": os.environ["PATH"], "GPUBOOK_ENTRYPOINT_DRY_RUN": "1"}, capture_output=True, text=True,
        check=True,
    )
    assert problems(result.stdout.strip()) == []


def test_dockerfile_is_non_root_exec_form_and_has_no_training_stack_by_default():
    dockerfile = (DEPLOY / "images" / "app.Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", dockerfile, re.M).group(1)
    assert json.loads(entrypoint)[:2] == ["/usr/bin/tini", "--"]  # exec form, tini is PID 1
    assert re.search(r"^USER \$\{UID\}", dockerfile, re.M)
    assert re.search(r"^ARG UID=10001$", dockerfile, re.M)
    assert re.search(r"^ARG WITH_TRAINING=false$", dockerfile, re.M)
    assert "collectstatic" in dockerfile
    # The entrypoint script is in the build context and executable.
    assert "!deploy/images/app-entrypoint.sh" in (DEPLOY / "images" / "app.Dockerfile.dockerignore").read_text()
    assert os.access(DEPLOY / "images" / "app-entrypoint.sh", os.X_OK)


def test_make_images_skips_without_docker(tmp_path):
    """`make images` → build.sh: SKIPPED (exit 0) where no Docker engine answers."""
    result = subprocess.run(
        ["bash", str(DEPLOY / "images" / "build.sh"), "app"],
        env={"PATH": os.environ["PATH"], "DOCKER": str(tmp_path / "no-docker")}, capture_output=True, text=True,
    )
    assert result.returncode == 0 and "SKIPPED" in result.stderr
    dry = subprocess.run(["bash", str(DEPLOY / "images" / "build.sh"), "--dry-run"], capture_output=True, text=True,
                         check=True)
    assert "-f deploy/images/app.Dockerfile" in dry.stdout and "-f deploy/images/trainer.Dockerfile" in dry.stdout
