"""The deployment files parse, fit together, and only set settings the Settings model knows.

Kubernetes manifests (infra/k8s), systemd units and their environment file (infra/systemd), the spark-submit
wrapper (infra/spark). ``kubectl kustomize infra/k8s`` is not run here (no kubectl in CI; Debian's is too old
for the kustomization format): infra/README.md has it as a manual check.
"""

from __future__ import annotations

import os
import py_compile
import re
import subprocess
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
import yaml

from bkaudit.settings_docs import setting_docs
from core.settings import CONFIG_FILE_ENV, Settings

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s"
SYSTEMD = REPO / "infra" / "systemd"
SPARK = REPO / "infra" / "spark"
RULES = REPO / "infra" / "prometheus" / "bkaudit-rules.yaml"

DOCUMENTED = {row.key: row for row in setting_docs()}
ENV_VARS = {row.env_var for row in DOCUMENTED.values()} | {CONFIG_FILE_ENV}


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every YAML document under infra/k8s, by file."""
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        for path in sorted(K8S.glob("*.yaml"))
    }


def objects() -> list[dict[str, Any]]:
    return [doc for name, docs in manifests().items() if name != "kustomization.yaml" for doc in docs]


def one(kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def leaf_keys(mapping: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        if isinstance(value, dict) and f"{prefix}{key}" not in DOCUMENTED:
            keys += leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


# ------------------------------------------------------------------------------------------ Kubernetes


def test_manifests_parse_with_the_expected_kinds():
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objects())
    assert kinds == [
        ("ConfigMap", "bkaudit-config"),
        ("Deployment", "bkaudit-watch"),
        ("Namespace", "bkaudit"),
        ("Secret", "bkaudit-credentials"),
        ("Service", "bkaudit-stream"),
        ("Service", "bkaudit-watch"),
        ("ServiceMonitor", "bkaudit-stream"),
        ("ServiceMonitor", "bkaudit-watch"),
        ("StatefulSet", "bkaudit-stream"),
    ]
    for obj in objects():
        assert obj["apiVersion"] and obj["metadata"]["name"]
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == "bkaudit", obj["metadata"]["name"]


def test_kustomization_lists_every_manifest_but_the_secret_template():
    (kustomization,) = manifests()["kustomization.yaml"]
    listed = set(kustomization["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.yaml"}


def test_one_watcher_and_one_job_with_persistent_storage():
    watcher = one("Deployment", "bkaudit-watch")["spec"]
    assert watcher["replicas"] == 1 and watcher["strategy"]["type"] == "Recreate"
    assert watcher["template"]["spec"]["containers"][0]["args"] == ["watch"]
    stream = one("StatefulSet", "bkaudit-stream")["spec"]
    assert stream["replicas"] == 1
    assert stream["template"]["spec"]["containers"][0]["args"] == ["stream"]
    claims = {c["metadata"]["name"]: c for c in stream["volumeClaimTemplates"]}
    mounts = {m["name"]: m["mountPath"] for m in stream["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert "ReadWriteOnce" in claims["data"]["spec"]["accessModes"]
    settings = configured_settings()
    for root in (settings.lakehouse_root, settings.checkpoint_root):
        assert str(root).startswith(mounts["data"] + "/"), f"{root} is not on the persistent volume"


def configured_settings() -> Settings:
    text = one("ConfigMap", "bkaudit-config")["data"]["config.yaml"]
    return Settings(**yaml.safe_load(text))


def test_configmap_settings_are_valid_and_documented():
    config = yaml.safe_load(one("ConfigMap", "bkaudit-config")["data"]["config.yaml"])
    unknown = [key for key in leaf_keys(config) if key not in DOCUMENTED]
    assert not unknown, f"not settings: {unknown}"
    configured_settings()  # validates types and constraints


def _containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(workload name, pod template, container) of both workloads."""
    out = []
    for kind, name in (("Deployment", "bkaudit-watch"), ("StatefulSet", "bkaudit-stream")):
        template = one(kind, name)["spec"]["template"]
        for container in template["spec"]["containers"]:
            out.append((name, template, container))
    return out


def test_containers_read_the_config_and_optional_credentials():
    secret_keys = set(one("Secret", "bkaudit-credentials")["stringData"])
    assert secret_keys <= ENV_VARS
    assert all(DOCUMENTED[k].secret for k in DOCUMENTED if DOCUMENTED[k].env_var in secret_keys)
    for name, template, container in _containers():
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert set(env) <= ENV_VARS, name
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        config_dir = str(Path(env[CONFIG_FILE_ENV]).parent)
        assert volumes[mounts[config_dir]]["configMap"]["name"] == "bkaudit-config", name
        (source,) = container["envFrom"]
        assert source["secretRef"] == {"name": "bkaudit-credentials", "optional": True}, name


def test_metrics_ports_agree_from_settings_to_scrape_config():
    settings = configured_settings()
    ports = {"bkaudit-watch": settings.watcher.metrics_port, "bkaudit-stream": settings.stream.metrics_port}
    assert all(ports.values()), "metrics must be on for the dashboard and the rules"
    job_patterns = set(re.findall(r'job=~"([^"]+)"', RULES.read_text()))
    for name, template, container in _containers():
        port = ports[name]
        container_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container_ports["metrics"] == port, name
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(port), name
        service = one("Service", name)
        labels = template["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items(), name
        (service_port,) = service["spec"]["ports"]
        assert service_port["port"] == port and service_port["name"] == "metrics", name
        monitor = one("ServiceMonitor", name)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        # The ServiceMonitor's job label is the Service name: the rules must select it.
        assert any(re.fullmatch(pattern, name) for pattern in job_patterns), name


# ------------------------------------------------------------------------------------------ systemd


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file as section → key → values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.fullmatch(r"\[(\w+)\]", line)
        if header:
            current = sections.setdefault(header.group(1), {})
            continue
        assert current is not None and "=" in line, f"{path.name}: {raw!r}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize(
    ("name", "command", "min_stop_s"),
    [("bkaudit-watch.service", "watch", 30), ("bkaudit-stream.service", "stream", 60)],
)
def test_systemd_units_run_the_command_and_stop_gracefully(name, command, min_stop_s):
    sections = unit(SYSTEMD / name)
    assert set(sections) == {"Unit", "Service", "Install"}
    service = sections["Service"]
    (exec_start,) = service["ExecStart"]
    assert exec_start.split()[-1] == command and exec_start.split()[0].endswith("/bin/bkaudit")
    assert service["KillSignal"] == ["SIGTERM"]
    # Longer than the clean shutdown: the watcher flushes Kafka (30 s), the job waits for its batch (60 s).
    assert int(service["TimeoutStopSec"][0]) > min_stop_s
    assert "/etc/bkaudit/bkaudit.env" in service["EnvironmentFile"]
    assert service["RestartPreventExitStatus"] == ["2"]  # bad configuration: a restart would not help
    assert sections["Install"]["WantedBy"] == ["multi-user.target"]


def environment_file() -> dict[str, str]:
    values = {}
    for raw in (SYSTEMD / "bkaudit.env").read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_environment_file_sets_known_settings_that_validate(monkeypatch):
    values = environment_file()
    assert set(values) <= ENV_VARS, set(values) - ENV_VARS
    for name in [n for n in os.environ if n.startswith("BKAUDIT_")]:
        monkeypatch.delenv(name)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    by_env = {row.env_var: row.key for row in DOCUMENTED.values()}
    for key, value in values.items():
        actual = reduce(getattr, by_env[key].split("."), settings)
        shown = str(actual).lower() if isinstance(actual, bool) else str(actual)  # env booleans: true/false
        assert shown == value, key
    stream_state = Path("/var/lib/bkaudit")
    assert stream_state in Path(settings.lakehouse_root).parents
    assert stream_state in Path(settings.checkpoint_root).parents
    (state_directory,) = unit(SYSTEMD / "bkaudit-stream.service")["Service"]["StateDirectory"]
    assert stream_state == Path("/var/lib") / state_directory


# ------------------------------------------------------------------------------------------ spark-submit


def test_spark_submit_wrapper_is_valid_and_points_at_the_entry_file(tmp_path):
    script = SPARK / "submit.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert '"$here/bkaudit_stream.py"' in text
    assert "BKAUDIT_SPARK__MASTER" in text  # the session helper sets the master: it must match --master
    py_compile.compile(str(SPARK / "bkaudit_stream.py"), cfile=str(tmp_path / "entry.pyc"), doraise=True)
    missing = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}
    )
    assert missing.returncode != 0 and "SPARK_MASTER" in missing.stderr


# ------------------------------------------------------------------------------------------ documentation

OPERATIONS_DOCS = [
    REPO / "README.md",
    REPO / "docs" / "reference.md",
    REPO / "infra" / "README.md",
    REPO / "docs" / "alerts.md",
    REPO / "docs" / "troubleshooting.md",
]


def _anchors(markdown: str) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("document", OPERATIONS_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_of_the_operations_docs_resolve(document):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path_part, _, anchor = target.partition("#")
        linked = (document.parent / path_part).resolve() if path_part else document
        if not linked.exists():
            broken.append(target)
            continue
        if anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
            broken.append(target)
    assert not broken, f"{document.name}: {broken}"


# ------------------------------------------------------------------------------------------ bkaudit agent


def agent_options() -> set[str]:
    import typer

    from bkaudit.cli.main import app

    command = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    return {name for param in command.params for name in param.opts}


def test_the_agent_unit_runs_the_agent_read_only_with_tls_and_a_token():
    service = unit(SYSTEMD / "bkaudit-agent.service")["Service"]
    (exec_start,) = service["ExecStart"]
    words = exec_start.split()
    assert words[0].endswith("/bin/bkaudit") and words[1] == "agent"
    given = {word for word in words[2:] if word.startswith("--")}
    assert given <= agent_options() and {"--tls-cert", "--tls-key", "--token-file"} <= given
    ledger_dirs = words[words.index("--ledger-dirs") + 1]
    assert service["ReadOnlyPaths"] == [ledger_dirs] and service["ProtectSystem"] == ["strict"]
    assert service["RestartPreventExitStatus"] == ["2"]


def test_the_agent_sidecar_mounts_the_ledgers_read_only_and_passes_known_options():
    patch = yaml.safe_load((K8S / "agent" / "bookie-agent-sidecar.yaml").read_text())
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "agent"
    options = dict(arg.split("=", 1) for arg in container["args"][1:])
    assert set(options) <= agent_options() and {"--tls-cert", "--tls-key", "--token-file"} <= set(options)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[options["--ledger-dirs"]]["readOnly"] is True
    secret_dir = str(Path(options["--token-file"]).parent)
    assert mounts[secret_dir]["readOnly"] is True
    secret = yaml.safe_load((K8S / "agent" / "secret.yaml").read_text())
    assert set(secret["stringData"]) == {
        Path(options[o]).name for o in ("--token-file", "--tls-cert", "--tls-key")
    }
