"""The shipped docker-compose.yml is not an open door (issue 23, point 9): Redis, the broker whose
tasks run with the workers' credentials, publishes no port and requires a password that every
client URL carries; the README says the broker is a trust boundary."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "${REDIS_PASSWORD:?set REDIS_PASSWORD}"


def test_redis_is_private_and_needs_a_password():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    redis = compose["services"]["redis"]
    assert "ports" not in redis and "network_mode" not in redis
    command = redis["command"]
    assert command[command.index("--requirepass") + 1] == PASSWORD
    urls = {name: (service.get("environment") or {}) for name, service in compose["services"].items()}
    clients = {name: env for name, env in urls.items() if "TOKENMILL_BROKER_URL" in env}
    assert set(clients) == {"worker-gpu0", "worker-gpu1", "beat", "serve"}
    for name, env in clients.items():
        for key in ("TOKENMILL_BROKER_URL", "TOKENMILL_RESULT_BACKEND"):
            assert env[key].startswith(f"redis://:{PASSWORD}@redis:6379/"), (name, key)
    serve = compose["services"]["serve"]["command"]
    assert serve[serve.index("--broker") + 1] == f"redis://:{PASSWORD}@redis:6379/0"


def test_every_service_has_a_healthcheck_and_serve_waits_for_readiness():
    """Issue 42: the compose file runs serve and, for a local trial, an S3 store; each service says
    when it is healthy, and serve's check is its readiness route, not mere liveness."""
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert {"redis", "serve", "worker-gpu0", "worker-gpu1", "s3"} <= set(services)
    for name, service in services.items():
        if name != "beat":  # beat has no port to ask; it restarts when it exits
            assert service.get("healthcheck", {}).get("test"), name
    assert any("/readyz" in part for part in services["serve"]["healthcheck"]["test"])
    assert services["serve"]["entrypoint"] == ["tokenmill", "serve"]
    assert all(port.startswith("127.0.0.1:") for port in services["serve"]["ports"] + services["s3"]["ports"])
    assert services["s3"]["profiles"] == ["trial"] and "-s3" in services["s3"]["command"]
    for name in ("serve", "worker-gpu0", "beat"):
        assert services[name]["depends_on"]["redis"]["condition"] == "service_healthy", name


def test_the_readme_names_the_broker_a_trust_boundary():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Trust and tenants", 1)[1].split("\n## ", 1)[0]
    assert "trust boundary" in section and "--allow-env" in section and "--allowed-url-prefix" in section
