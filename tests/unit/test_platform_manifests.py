"""platform/kubernetes and platform/slurm, checked without a cluster.

Every manifest parses and names itself; every `trainmaster` and `ray` command in them (container
commands, the `ray start` KubeRay builds from rayStartParams, the invocations in the sbatch script)
parses with the real CLIs, as in test_compose.py; Ray runs with token auth everywhere; the Ray dashboard
is never exposed outside the cluster and only the api and dispatcher may reach it.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from tests.factories.commands import ray_cli, resolve
from trainmaster.cli.main import app

REPO = Path(__file__).resolve().parents[2]
PLATFORM = REPO / "platform"
K8S = PLATFORM / "kubernetes"
SBATCH = PLATFORM / "slurm" / "trainmaster.sbatch"
NAMESPACE = "trainmaster"
STANDALONE = {"secret.template.yaml", "gpu-time-slicing.yaml"}  # applied by hand, never by kustomize
CLUSTER_SCOPED = {"Namespace", "Queue"}
EXPOSED_SERVICE_TYPES = {"NodePort", "LoadBalancer"}
DASHBOARD_PORT = 8265

YAML_FILES = sorted(p for p in K8S.rglob("*") if p.suffix in {".yaml", ".yml"})
DOCS: list[tuple[str, dict[str, Any]]] = [
    (path.relative_to(K8S).as_posix(), doc)
    for path in YAML_FILES
    for doc in yaml.safe_load_all(path.read_text())
    if doc is not None
]


def docs(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc.get("kind") == kind]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for doc in docs(kind) if name is None or doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@dataclass
class PodTemplate:
    name: str
    spec: dict[str, Any]
    labels: dict[str, str]
    ray_cluster: str | None = None
    ray_node_type: str | None = None  # "head" or "worker"
    ray_start_params: dict[str, Any] = field(default_factory=dict)


def pod_templates() -> Iterator[PodTemplate]:
    for _, doc in DOCS:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind in {"Deployment", "StatefulSet", "DaemonSet"}:
            template = doc["spec"]["template"]
            yield PodTemplate(name, template["spec"], template["metadata"].get("labels", {}))
        elif kind == "RayCluster":
            head = doc["spec"]["headGroupSpec"]
            groups = [("head", "headgroup", head)] + [
                ("worker", group["groupName"], group) for group in doc["spec"].get("workerGroupSpecs", [])
            ]
            for node_type, group_name, group in groups:
                template = group["template"]
                # The labels KubeRay puts on every pod it creates, beside the template's own.
                labels = {
                    **template.get("metadata", {}).get("labels", {}),
                    "ray.io/cluster": name,
                    "ray.io/node-type": node_type,
                    "ray.io/group": group_name,
                    "ray.io/is-ray-node": "yes",
                }
                yield PodTemplate(
                    f"{name}/{group_name}", template["spec"], labels, name, node_type, group.get("rayStartParams", {})
                )


TEMPLATES = list(pod_templates())
RAY_TEMPLATES = [t for t in TEMPLATES if t.ray_cluster]
APP_TEMPLATES = [t for t in TEMPLATES if not t.ray_cluster]


def component(name: str) -> PodTemplate:
    found = [t for t in APP_TEMPLATES if t.labels.get("app.kubernetes.io/component") == name]
    assert len(found) == 1, f"expected one {name} pod template"
    return found[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container.get("env", [])}


def cli_group(program: str) -> Any:
    return {"trainmaster": typer.main.get_command(app), "ray": ray_cli()}[Path(program).name]


# -- every file, every document ----------------------------------------------------------------------------


def test_the_manifests_are_there() -> None:
    names = {path.name for path in YAML_FILES}
    assert {
        "kustomization.yaml",
        "namespace.yaml",
        "secret.template.yaml",
        "raycluster.yaml",
        "volcano-queue.yaml",
        "gpu-time-slicing.yaml",
        "api.yaml",
        "dispatcher.yaml",
        "networkpolicy.yaml",
    } <= names
    assert (K8S / "README.md").is_file()
    assert SBATCH.is_file() and (SBATCH.parent / "README.md").is_file()


@pytest.mark.parametrize(("path", "doc"), DOCS, ids=[f"{p}:{d.get('kind')}" for p, d in DOCS])
def test_every_document_has_api_version_kind_and_name(path: str, doc: dict[str, Any]) -> None:
    assert isinstance(doc, dict), f"{path}: a document must be a mapping"
    assert doc.get("apiVersion") and doc.get("kind"), f"{path}: apiVersion and kind are required"
    assert doc.get("metadata", {}).get("name"), f"{path}: metadata.name is required"


def test_kustomization_lists_every_manifest_but_the_standalone_ones() -> None:
    kustomization = one("Kustomization")
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    for resource in resources:
        assert (K8S / resource).is_file(), f"kustomization.yaml lists a missing file {resource}"
    listed = set(resources) | STANDALONE | {"kustomization.yaml"}
    assert {path.relative_to(K8S).as_posix() for path in YAML_FILES} == listed


def test_namespaced_objects_name_their_namespace() -> None:
    for path, doc in DOCS:
        if path == "gpu-time-slicing.yaml":
            continue  # the NVIDIA device plugin's namespace, not ours
        if doc["kind"] in CLUSTER_SCOPED or doc["kind"] == "Kustomization":
            assert "namespace" not in doc["metadata"], f"{path}: {doc['kind']} is cluster-scoped"
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{path}: {doc['kind']} outside {NAMESPACE}"
    assert one("Namespace")["metadata"]["name"] == NAMESPACE


# -- commands parse with the real CLIs ---------------------------------------------------------------------


def container_commands() -> list[tuple[str, list[str]]]:
    found = []
    for template in TEMPLATES:
        for container in template.spec.get("containers", []) + template.spec.get("initContainers", []):
            argv = list(container.get("command", [])) + list(container.get("args", []))
            if argv and Path(argv[0]).name in {"trainmaster", "ray"}:
                found.append((f"{template.name}/{container['name']}", argv))
    return found


@pytest.mark.parametrize(("where", "argv"), container_commands(), ids=[w for w, _ in container_commands()])
def test_container_commands_are_real_entry_points_with_valid_flags(where: str, argv: list[str]) -> None:
    assert all(isinstance(arg, str) for arg in argv), f"{where}: every argument must be a string"
    context = resolve(cli_group(argv[0]), argv[1:])
    assert context.command.name in {"api", "dispatcher", "start", "upgrade"}


def test_api_and_dispatcher_commands_are_the_compose_ones() -> None:
    commands = dict(container_commands())
    assert commands["trainmaster-api/api"] == ["trainmaster", "api", "--host", "0.0.0.0", "--port", "8000"]
    assert commands["trainmaster-api/migrate"] == ["trainmaster", "db", "upgrade"]
    assert [argv for where, argv in commands.items() if where.startswith("trainmaster-dispatcher/")] == [
        ["trainmaster", "dispatcher"]
    ]


def quantity(value: Any) -> float:
    """A Kubernetes quantity ("500m", "16Gi", 4) as a number."""
    text = str(value)
    suffixes = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    for suffix in sorted(suffixes, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * suffixes[suffix]
    return float(text)


def kuberay_ray_start(template: PodTemplate) -> list[str]:
    """The `ray start` argv KubeRay builds for a group: its defaults, then rayStartParams over them."""
    container = template.spec["containers"][0]
    limits = container.get("resources", {}).get("limits", {})
    params: dict[str, str] = {"metrics-export-port": "8080", "dashboard-agent-listen-port": "52365", "block": "true"}
    if template.ray_node_type == "head":
        params["dashboard-host"] = "0.0.0.0"
    else:
        params["address"] = f"{template.ray_cluster}-head-svc:6379"
    if "cpu" in limits:
        params["num-cpus"] = str(max(1, int(quantity(limits["cpu"]))))
    if "memory" in limits:
        params["memory"] = str(int(quantity(limits["memory"])))
    gpus = [quantity(v) for k, v in limits.items() if k.endswith("gpu")]
    if gpus and gpus[0]:
        params["num-gpus"] = str(int(gpus[0]))
    params.update(template.ray_start_params)
    argv = ["start"] + (["--head"] if template.ray_node_type == "head" else [])
    for key, value in params.items():
        if value.lower() in {"true", "false"} and key not in {"log-color", "include-dashboard"}:
            argv += [f"--{key}"] if value.lower() == "true" else []
        else:
            argv.append(f"--{key}={value}")
    return argv


@pytest.mark.parametrize("template", RAY_TEMPLATES, ids=[t.name for t in RAY_TEMPLATES])
def test_ray_start_params_parse_as_kuberay_passes_them(template: PodTemplate) -> None:
    params = template.ray_start_params
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams is map[string]string: quote values"
    assert "address" not in params and "block" not in params, "KubeRay sets these itself"
    context = resolve(ray_cli(), kuberay_ray_start(template))
    assert context.command.name == "start"


# -- token auth --------------------------------------------------------------------------------------------


def secret_template() -> dict[str, Any]:
    return one("Secret", "trainmaster-secrets")


def assert_from_secret(env: dict[str, dict[str, Any]], name: str, where: str) -> None:
    assert name in env, f"{where}: {name} is not set"
    ref = env[name].get("valueFrom", {}).get("secretKeyRef")
    assert ref, f"{where}: {name} must come from the Secret, never a literal"
    assert ref["name"] == secret_template()["metadata"]["name"]
    assert ref["key"] in secret_template()["stringData"], f"{where}: the Secret template has no key {ref['key']}"


@pytest.mark.parametrize("template", TEMPLATES, ids=[t.name for t in TEMPLATES])
def test_ray_token_auth_is_on_in_every_pod_that_talks_to_ray(template: PodTemplate) -> None:
    for container in template.spec["containers"]:
        env = env_of(container)
        where = f"{template.name}/{container['name']}"
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{where}: RAY_AUTH_MODE must be token"
        assert_from_secret(env, "RAY_AUTH_TOKEN", where)


def test_the_secret_template_holds_placeholders_only() -> None:
    secret = secret_template()
    assert "data" not in secret, "no base64 values: stringData placeholders only"
    assert secret["stringData"], "the template documents its keys"
    for key, value in secret["stringData"].items():
        assert "CHANGE_ME" in value, f"{key} must be a CHANGE_ME placeholder"
    kustomization = one("Kustomization")
    assert "secret.template.yaml" not in kustomization["resources"], "the template is never applied as is"


# -- the Ray dashboard stays inside --------------------------------------------------------------------------


def test_the_ray_head_service_is_cluster_internal() -> None:
    for cluster in docs("RayCluster"):
        head = cluster["spec"]["headGroupSpec"]
        assert head.get("serviceType", "ClusterIP") == "ClusterIP"
        assert not head.get("enableIngress", False)
        assert head.get("headService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"


def test_the_ray_dashboard_is_not_exposed_by_any_service_ingress_or_host_port() -> None:
    head_services = {f"{c['metadata']['name']}-head-svc" for c in docs("RayCluster")}
    for service in docs("Service"):
        selector = service["spec"].get("selector", {})
        ports = service["spec"].get("ports", [])
        touches_ray = any(key.startswith("ray.io/") for key in selector) or any(
            DASHBOARD_PORT in (p.get("port"), p.get("targetPort")) or p.get("targetPort") == "dashboard" for p in ports
        )
        if touches_ray:
            assert service["spec"].get("type", "ClusterIP") not in EXPOSED_SERVICE_TYPES, service["metadata"]["name"]
    for path, doc in DOCS:
        if doc["kind"] in {"Ingress", "HTTPRoute", "GRPCRoute", "TCPRoute", "Route", "Gateway"}:
            text = yaml.safe_dump(doc)
            assert str(DASHBOARD_PORT) not in text and not any(svc in text for svc in head_services), path
    for template in RAY_TEMPLATES:
        assert not template.spec.get("hostNetwork", False), template.name
        for container in template.spec["containers"]:
            assert all("hostPort" not in port for port in container.get("ports", [])), template.name


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[operator]
        if not ok:
            return False
    return True


def covers(rule: dict[str, Any], port: int) -> bool:
    if not rule.get("ports"):
        return True
    for item in rule["ports"]:
        start = item.get("port")
        if start is None:
            return True
        if isinstance(start, str):  # a named port: the dashboard's is "dashboard"
            if start == "dashboard":
                return True
            continue
        if start <= port <= item.get("endPort", start):
            return True
    return False


def test_only_the_api_and_the_dispatcher_may_reach_the_dashboard_port() -> None:
    heads = [t for t in RAY_TEMPLATES if t.ray_node_type == "head"]
    api, dispatcher = component("api"), component("dispatcher")
    for head in heads:
        policies = [p for p in docs("NetworkPolicy") if matches(p["spec"]["podSelector"], head.labels)]
        assert policies, f"no NetworkPolicy selects the Ray head {head.name}"
        for policy in policies:
            assert "Ingress" in policy["spec"].get("policyTypes", ["Ingress"])
        rules = [rule for policy in policies for rule in policy["spec"].get("ingress", [])]
        to_dashboard = [rule for rule in rules if covers(rule, DASHBOARD_PORT)]
        assert to_dashboard, "some rule must let the api and the dispatcher in"
        for rule in to_dashboard:
            peers = rule.get("from")
            assert peers, "a rule without `from` admits everyone"
            for peer in peers:
                assert set(peer) == {"podSelector"}, "no namespaceSelector or ipBlock may reach the dashboard"
                selected = [t.name for t in TEMPLATES if matches(peer["podSelector"], t.labels)]
                assert set(selected) <= {api.name, dispatcher.name}, f"{selected} may reach the dashboard"
        admitted = {
            t.name
            for t in TEMPLATES
            for rule in to_dashboard
            for peer in rule["from"]
            if matches(peer["podSelector"], t.labels)
        }
        assert admitted == {api.name, dispatcher.name}
        # The Ray pods still reach the head on its other ports (GCS, raylet, object manager, ...).
        worker = next(t for t in RAY_TEMPLATES if t.ray_node_type == "worker")
        gcs_rules = [
            r for r in rules if covers(r, 6379) and any(matches(p["podSelector"], worker.labels) for p in r["from"])
        ]
        assert gcs_rules, "Ray workers must reach the GCS on 6379"


# -- Volcano, GPUs, storage ----------------------------------------------------------------------------------


def test_ray_pods_are_gang_scheduled_by_volcano_in_a_queue() -> None:
    queues = {q["metadata"]["name"]: q for q in docs("Queue")}
    for cluster in docs("RayCluster"):
        assert cluster["apiVersion"] == "ray.io/v1"
        labels = cluster["metadata"]["labels"]
        assert labels.get("ray.io/scheduler-name") == "volcano"
        queue = queues[labels["volcano.sh/queue-name"]]
        assert queue["apiVersion"] == "scheduling.volcano.sh/v1beta1"
        assert queue["spec"].get("reclaimable") is False, "running training pods must not be reclaimed"
    readme = (K8S / "README.md").read_text()
    assert "batchScheduler.name=volcano" in readme and "--enable-batch-scheduler" in readme


def test_training_runs_on_cpu_and_gpu_workers_never_on_the_head() -> None:
    head = next(t for t in RAY_TEMPLATES if t.ray_node_type == "head")
    assert head.ray_start_params.get("num-cpus") == "0"
    workers = [t for t in RAY_TEMPLATES if t.ray_node_type == "worker"]

    def gpus(template: PodTemplate) -> float:
        limits = template.spec["containers"][0].get("resources", {}).get("limits", {})
        return quantity(limits.get("nvidia.com/gpu", 0))

    assert any(gpus(t) == 0 for t in workers), "a CPU worker group"
    assert any(gpus(t) >= 1 for t in workers), "a GPU worker group with nvidia.com/gpu limits"
    assert gpus(head) == 0


def test_gpu_time_slicing_example_is_a_device_plugin_config() -> None:
    config_map = one("ConfigMap", "time-slicing-config")
    (config,) = [yaml.safe_load(text) for text in config_map["data"].values()]
    (resource,) = config["sharing"]["timeSlicing"]["resources"]
    assert resource["name"] == "nvidia.com/gpu" and resource["replicas"] > 1
    assert "resources_per_worker" in (K8S / "README.md").read_text()


def test_checkpoints_go_to_a_read_write_many_volume_mounted_at_shared_in_every_ray_pod() -> None:
    claims = {c["metadata"]["name"]: c for c in docs("PersistentVolumeClaim")}
    for template in RAY_TEMPLATES:
        volumes = {v["name"]: v for v in template.spec.get("volumes", [])}
        mounts = {m["mountPath"]: m["name"] for m in template.spec["containers"][0].get("volumeMounts", [])}
        assert "/shared" in mounts, f"{template.name} must mount /shared"
        claim = claims[volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"]]
        assert "ReadWriteMany" in claim["spec"]["accessModes"]
    storage = one("ConfigMap", "trainmaster-config")["data"]["TRAINMASTER_STORAGE_PATH"]
    assert storage.startswith(("/shared/", "s3://"))


def test_the_dispatcher_mounts_the_storage_the_ray_pods_write() -> None:
    """Its checkpoint collector deletes there what no policy, pin or retention keeps
    (api/dispatcher/checkpoint_collector.py); without the mount it would collect nothing, and Ray deletes
    nothing on a local path."""
    ray_claims = {
        v["persistentVolumeClaim"]["claimName"]
        for t in RAY_TEMPLATES
        for v in t.spec.get("volumes", [])
        if "persistentVolumeClaim" in v
    }
    spec = component("dispatcher").spec
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0].get("volumeMounts", [])}
    assert "/shared" in mounts, "the dispatcher must mount /shared"
    assert volumes[mounts["/shared"]]["persistentVolumeClaim"]["claimName"] in ray_claims


# -- api and dispatcher ------------------------------------------------------------------------------------


def test_api_runs_two_migrating_replicas_with_probes_behind_a_service() -> None:
    deployment = one("Deployment", "trainmaster-api")
    assert deployment["spec"]["replicas"] == 2
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (migrate,) = deployment["spec"]["template"]["spec"]["initContainers"]
    # Migrations as the owner in the init container alone; the api connects least-privileged.
    assert migrate["command"] == ["trainmaster", "db", "upgrade"]
    assert migrate["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "migration_database_url"
    keys = [e["valueFrom"]["secretKeyRef"]["key"] for e in container["env"] if "valueFrom" in e]
    assert "database_url" in keys and "migration_database_url" not in keys
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = one("Service", "trainmaster-api")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert matches({"matchLabels": service["spec"]["selector"]}, component("api").labels)
    assert [p["port"] for p in service["spec"]["ports"]] == [8000]


def test_dispatcher_runs_two_replicas() -> None:
    assert one("Deployment", "trainmaster-dispatcher")["spec"]["replicas"] == 2


@pytest.mark.parametrize("name", ["api", "dispatcher"])
def test_api_and_dispatcher_find_the_database_ray_and_each_other(name: str) -> None:
    (container,) = component(name).spec["containers"]
    assert_from_secret(env_of(container), "TRAINMASTER_DATABASE_URL", name)
    config_maps = [source["configMapRef"]["name"] for source in container.get("envFrom", [])]
    settings = {k: v for cm in config_maps for k, v in one("ConfigMap", cm)["data"].items()}
    (cluster,) = docs("RayCluster")
    ray_ns = cluster["metadata"]["namespace"]
    assert settings["TRAINMASTER_RAY_ADDRESS"] == f"http://{cluster['metadata']['name']}-head-svc.{ray_ns}.svc:8265"
    api_service = one("Service", "trainmaster-api")
    assert settings["TRAINMASTER_API_URL"] == f"http://trainmaster-api.{api_service['metadata']['namespace']}.svc:8000"


# -- the layout rule ---------------------------------------------------------------------------------------


def test_platform_holds_no_python() -> None:
    offenders = [
        p.relative_to(REPO).as_posix() for p in PLATFORM.rglob("*") if p.suffix == ".py" or p.name == "__init__.py"
    ]
    assert offenders == [], "platform/ must never hold Python: a package named platform shadows the stdlib"


# -- Slurm -------------------------------------------------------------------------------------------------


def test_sbatch_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_sbatch_script_passes_shellcheck() -> None:
    result = subprocess.run(["shellcheck", "-s", "bash", str(SBATCH)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


OPTIONAL_FLAGS = re.compile(r'"\$\{\w+\[@\]\}"')  # "${array[@]}": optional flags, empty when unset
EXPANSION = re.compile(r"\$\{[^{}]*\}|\$\([^()]*\)|\$\w+")
INVOCATION = re.compile(r"(?:^|(?<=[\s;&|(]))(ray|trainmaster)\s+(?=[a-z])")


def unquoted(line: str) -> list[bool]:
    """For each character of a shell line: is it outside single and double quotes?"""
    flags, single, double, escaped = [], False, False, False
    for char in line:
        flags.append(not single and not double)
        if escaped:
            escaped = False
        elif char == "\\" and not single:
            escaped = True
        elif char == "'" and not double:
            single = not single
        elif char == '"' and not single:
            double = not double
    return flags


def sbatch_invocations(text: str) -> list[list[str]]:
    """Every `ray ...` and `trainmaster ...` command in a shell script, with variables replaced by 1."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        outside = unquoted(line)
        for match in INVOCATION.finditer(line):
            if not outside[match.start(1)]:
                continue  # inside a message
            command = EXPANSION.sub("1", OPTIONAL_FLAGS.sub("", line[match.start(1) :]))
            lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            argv = []
            for token in lexer:
                if set(token) <= set("&|;()<>"):
                    break  # the end of this simple command
                argv.append(token)
            found.append(argv)
    return found


def test_sbatch_invocations_parse_with_the_real_clis() -> None:
    invocations = sbatch_invocations(SBATCH.read_text())
    leaves = []
    for argv in invocations:
        context = resolve(cli_group(argv[0]), argv[1:])
        leaves.append((argv[0], context.command.name, "--head" in argv))
    assert ("ray", "start", True) in leaves, "a Ray head"
    assert ("ray", "start", False) in leaves, "Ray workers"
    assert ("ray", "health-check", False) in leaves
    assert ("ray", "stop", False) in leaves
    assert ("trainmaster", "dispatcher", False) in leaves
    worker = next(argv for argv in invocations if argv[:2] == ["ray", "start"] and "--head" not in argv)
    assert any(arg.startswith("--address=") for arg in worker)


def test_the_sbatch_extraction_finds_commands_and_skips_messages() -> None:
    script = (
        'log "ray start runs below"\n'
        "srun --nodes=1 \\\n"
        '    ray start --head --no-such-flag="$x" "${opts[@]}" >/dev/null 2>&1 &\n'
    )
    (argv,) = sbatch_invocations(script)
    assert argv == ["ray", "start", "--head", "--no-such-flag=1"]
    with pytest.raises(Exception, match="No such option"):
        resolve(ray_cli(), argv[1:])


def test_sbatch_script_uses_a_private_token_and_cleans_up() -> None:
    text = SBATCH.read_text()
    assert "export RAY_AUTH_MODE=token" in text
    assert re.search(r"export RAY_AUTH_TOKEN_PATH=", text)
    assert "umask 077" in text and 'chmod 600 "$RAY_AUTH_TOKEN_PATH"' in text
    assert "trap cleanup EXIT" in text and re.search(r"trap '[^']*' TERM", text)
    assert re.search(r"^#SBATCH --signal=B:TERM@\d+$", text, re.M), "the batch shell hears the time limit coming"
    assert 'rm -f "$RAY_AUTH_TOKEN_PATH"' in text
    assert text.startswith("#!/usr/bin/env bash\n")
