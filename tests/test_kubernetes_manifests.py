"""deploy/kubernetes: the base and the example overlay render (kustomize) to documents that are
valid for the pinned Kubernetes release, strictly (no unknown field), and that run the product as
docker-compose.yml does: serving replicas probed on the v2 health paths, drained within their
grace period, kept by a disruption budget, scaled by an autoscaler; settings from a ConfigMap and
a Secret that name only variables the code reads. Offline: no cluster."""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path

import pytest
import yaml

from tests import kube

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
BASE, OVERLAY, EXTRAS = DEPLOY / "base", DEPLOY / "overlays" / "example", DEPLOY / "extras"
APPS = ("mmc-console", "mmc-worker", "mmc-beat", "mmc-serving")
# uvicorn's graceful shutdown after the drain (serving/cli.py: timeout_graceful_shutdown=5)
UVICORN_SHUTDOWN_SECONDS = 5
# Set in the ConfigMap for code that is not here yet: name -> who reads it.
NOT_YET_READ: dict[str, str] = {}


@pytest.fixture(scope="module", params=["base", "overlay"])
def rendered(request) -> dict[tuple[str, str], dict]:
    docs = kube.render(BASE if request.param == "base" else OVERLAY)
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_spec(docs, name: str) -> dict:
    return docs["Deployment", name]["spec"]["template"]["spec"]


def container(docs, name: str) -> dict:
    (only,) = pod_spec(docs, name)["containers"]
    return only


def config(docs) -> dict[str, str]:
    return docs["ConfigMap", "mmc-config"]["data"]


def every_document() -> list[tuple[str, dict]]:
    out = [(f"base {d['kind']}", d) for d in kube.render(BASE)]
    out += [(f"overlay {d['kind']}", d) for d in kube.render(OVERLAY)]
    out += [(f"extras/{p.name}", d) for p in sorted(EXTRAS.glob("*.yaml"))
            for d in kube.load_documents(p)]
    return out


def test_every_rendered_manifest_is_valid_for_the_pinned_kubernetes_release():
    docs = every_document()
    kinds = {d["kind"] for _, d in docs}
    assert {"ConfigMap", "Secret", "PersistentVolumeClaim", "Deployment", "Service", "Ingress",
            "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} <= kinds
    for where, doc in docs:
        try:
            kube.validate(doc)
        except kube.SchemaError as exc:
            pytest.fail(f"{where}: {exc}")


def test_the_validation_refuses_a_misspelt_field():
    """The check above can fail: a typo anywhere in a document is an unknown field."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kube.render(BASE)}
    deployment = copy.deepcopy(docs["Deployment", "mmc-serving"])
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    with pytest.raises(kube.SchemaError, match="readinesProbe"):
        kube.validate(deployment)
    monitor = copy.deepcopy(docs["ServiceMonitor", "mmc-serving"])
    monitor["spec"]["endpoints"][0]["pathh"] = monitor["spec"]["endpoints"][0].pop("path")
    with pytest.raises(kube.SchemaError, match="pathh"):
        kube.validate(monitor)
    del monitor["spec"]["selector"]
    with pytest.raises(kube.SchemaError, match="selector"):
        kube.validate(monitor)


@pytest.mark.skipif(not shutil.which("kubectl"), reason="kubectl (kustomize) is not installed")
@pytest.mark.parametrize("folder", [BASE, OVERLAY], ids=["base", "overlay"])
def test_the_simple_renderer_agrees_with_kustomize(folder):
    """Where kubectl is missing, the specs render with tests/kube.py: it must say what
    kustomize says."""
    def key(d):
        return d["kind"], d["metadata"]["name"]

    assert sorted(kube.render_simple(folder), key=key) == sorted(kube.render_kubectl(folder),
                                                                 key=key)


def test_the_overlay_sets_namespace_image_replicas_and_settings():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in kube.render(OVERLAY)}
    assert {d["metadata"].get("namespace") for d in docs.values()} == {"ml-serving"}
    for app in APPS:
        assert container(docs, app)["image"] == "registry.example.com/ml/mmc:0.1.0"
    assert docs["Deployment", "mmc-console"]["spec"]["replicas"] == 2
    assert docs["Deployment", "mmc-worker"]["spec"]["replicas"] == 3
    assert config(docs)["MMC_DRAIN_SECONDS"] == "15"
    assert config(docs)["ARTIFACT_ROOT"] == "/artifacts"  # the base's keys stay
    env = {e["name"]: e for e in container(docs, "mmc-serving")["env"]}
    assert env["MMC_PROVIDERS"]["value"] == "CPUExecutionProvider"
    assert env["MMC_REPLICA_ADDRESS"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_serving_replicas_are_probed_on_the_v2_health_paths(rendered):
    c = container(rendered, "mmc-serving")
    port = {p["name"]: p["containerPort"] for p in c["ports"]}[c["readinessProbe"]["httpGet"]
                                                              ["port"]]
    assert c["command"][:2] == ["mmc-serve", "--registry"]
    assert c["command"][c["command"].index("--port") + 1] == str(port)
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_a_stopping_serving_replica_drains_within_its_grace_period(rendered):
    """preStop (the Service forgets the pod), then SIGTERM: not ready and `Connection: close`
    for MMC_DRAIN_SECONDS at most, then uvicorn's shutdown; the kubelet must not kill sooner."""
    c = container(rendered, "mmc-serving")
    pre_stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(config(rendered)["MMC_DRAIN_SECONDS"])
    assert drain > 0
    grace = pod_spec(rendered, "mmc-serving")["terminationGracePeriodSeconds"]
    assert grace >= float(pre_stop[1]) + drain + UVICORN_SHUTDOWN_SECONDS + 5


def test_serving_has_a_disruption_budget_and_a_cpu_autoscaler(rendered):
    labels = rendered["Deployment", "mmc-serving"]["spec"]["template"]["metadata"]["labels"]
    pdb = rendered["PodDisruptionBudget", "mmc-serving"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    hpa = rendered["HorizontalPodAutoscaler", "mmc-serving"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                     "name": "mmc-serving"}
    assert hpa["minReplicas"] > pdb["minAvailable"]  # a drain can always evict one
    assert [m["resource"]["name"] for m in hpa["metrics"]] == ["cpu"]
    assert container(rendered, "mmc-serving")["resources"]["requests"]["cpu"]  # HPA needs it
    # the autoscaler owns the replica count: an apply must not reset it
    assert "replicas" not in rendered["Deployment", "mmc-serving"]["spec"]


def test_the_documented_autoscaler_scales_on_a_metric_serving_exports():
    (hpa,) = kube.load_documents(EXTRAS / "hpa-pending-requests.yaml")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert name == "nv_inference_pending_request_count"
    assert f'"{name}"' in (REPO / "serving" / "core" / "stats.py").read_text()
    (adapter,) = kube.load_documents(EXTRAS / "prometheus-adapter-rules.yaml")
    (rule,) = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(name + "{")
    assert rule["name"]["as"] == name
    assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}


def test_prometheus_scrapes_the_serving_replicas_metrics(rendered):
    monitor = rendered["ServiceMonitor", "mmc-serving"]["spec"]
    service = rendered["Service", "mmc-serving"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_the_ingress_sends_inference_to_serving_and_the_rest_to_the_console(rendered):
    (rule,) = rendered["Ingress", "mmc"]["spec"]["rules"]
    backends = {p["path"]: p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
    assert backends == {"/v2": "mmc-serving", "/": "mmc-console"}
    assert rule["host"] in config(rendered)["ALLOWED_HOSTS"].split(",")
    assert f"https://{rule['host']}" in config(rendered)["CSRF_TRUSTED_ORIGINS"].split(",")


def names_the_code_reads() -> set[str]:
    """Environment variables read by the settings, the data plane and the ASGI entry."""
    names = set()
    sources = [REPO / "console" / "settings.py", REPO / "console" / "asgi.py",
               *sorted((REPO / "serving").rglob("*.py"))]
    for path in sources:
        text = path.read_text()
        names |= set(re.findall(r'\benv(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]*)"', text))
        names |= set(re.findall(r'\.get\(\s*"([A-Z][A-Z0-9_]*)"', text))
    return names


def test_every_variable_the_manifests_set_is_one_the_code_reads(rendered):
    read = names_the_code_reads()
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "MMC_DRAIN_SECONDS"} <= read
    assert not set(NOT_YET_READ) & read, "read now: drop it from NOT_YET_READ"
    set_here = (set(config(rendered)) | set(rendered["Secret", "mmc-secrets"]["stringData"])
                | set(rendered["Secret", "mmc-replica"]["stringData"]))
    for app in APPS:
        set_here |= {e["name"] for e in container(rendered, app).get("env", [])}
    unknown = set_here - read - set(NOT_YET_READ)
    assert not unknown, f"set by the manifests, read by nothing: {sorted(unknown)}"


def test_every_process_gets_the_clustered_settings_and_the_artifact_volume(rendered):
    secret = rendered["Secret", "mmc-secrets"]["stringData"]
    assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} <= set(secret)
    assert secret["DATABASE_URL"].startswith("postgres://")
    assert secret["REDIS_URL"].startswith("redis://")
    pvc = rendered["PersistentVolumeClaim", "mmc-artifacts"]["spec"]
    assert pvc["accessModes"] == ["ReadWriteMany"]
    assert config(rendered)["ARTIFACT_STORE"] == ""  # the folder ARTIFACT_ROOT, on the volume
    assert config(rendered)["MMC_KSERVE_STORAGE_URI"] == "pvc://mmc-artifacts"
    for app in APPS:
        c = container(rendered, app)
        assert {"configMapRef": {"name": "mmc-config"}} in c["envFrom"], app
        if app == "mmc-serving":  # test_serving_replicas_hold_no_database_credentials
            continue
        assert {"secretRef": {"name": "mmc-secrets"}} in c["envFrom"], app
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        assert mounts.get(config(rendered)["MMC_DATA_DIR"]) == "data", app
        if app == "mmc-beat":  # schedules tasks, never touches an artifact
            continue
        volumes = {v["name"]: v for v in pod_spec(rendered, app)["volumes"]}
        volume = volumes[mounts[config(rendered)["ARTIFACT_ROOT"]]]
        assert volume["persistentVolumeClaim"]["claimName"] == "mmc-artifacts", app
    assert pod_spec(rendered, "mmc-beat")  # one beat, never two during a rollout:
    assert rendered["Deployment", "mmc-beat"]["spec"]["strategy"] == {"type": "Recreate"}
    assert rendered["Deployment", "mmc-beat"]["spec"]["replicas"] == 1


def test_serving_replicas_hold_no_database_credentials(rendered):
    """Replicas follow the console over HTTP with the replica credential alone: no secret with
    the database or Redis URL, no artifact volume; the console accepts the same credential."""
    c = container(rendered, "mmc-serving")
    assert c["envFrom"] == [{"configMapRef": {"name": "mmc-config"}},
                            {"secretRef": {"name": "mmc-replica"}}]
    replica_secret = rendered["Secret", "mmc-replica"]["stringData"]
    assert set(replica_secret) == {"MMC_REPLICA_TOKEN", "MMC_QUOTA_REDIS_URL"}
    assert replica_secret["MMC_QUOTA_REDIS_URL"].endswith("/1")  # not the broker's database
    assert not {"DATABASE_URL", "REDIS_URL", "SECRET_KEY"} & set(config(rendered))
    assert not {"DATABASE_URL", "REDIS_URL"} & {e["name"] for e in c.get("env", [])}
    assert c["command"][:3] == ["mmc-serve", "--registry", "http://mmc-console:8000"]
    volumes = pod_spec(rendered, "mmc-serving")["volumes"]
    assert all("persistentVolumeClaim" not in v for v in volumes), volumes
    console = container(rendered, "mmc-console")
    assert {"secretRef": {"name": "mmc-replica"}} in console["envFrom"]
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert set(compose["serving"]["environment"]) == {"MMC_REPLICA_TOKEN",
                                                     "MMC_REPLICA_CACHE_DIR",
                                                     "MMC_QUOTA_REDIS_URL"}
    # the console reads daily quotas where the replicas count them
    console_env = compose["console"]["environment"]
    assert console_env["MMC_QUOTA_REDIS_URL"] == compose["serving"]["environment"][
        "MMC_QUOTA_REDIS_URL"] != console_env["REDIS_URL"]
    assert "volumes" not in compose["serving"]
    assert compose["serving"]["command"][:3] == ["mmc-serve", "--registry", "http://console:8000"]


def test_the_processes_are_the_ones_docker_compose_runs(rendered):
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    assert container(rendered, "mmc-console")["command"] == compose["console"]["command"]
    assert container(rendered, "mmc-worker")["command"] == compose["worker"]["command"]
    beat = container(rendered, "mmc-beat")["command"]
    assert beat[:len(compose["beat"]["command"])] == compose["beat"]["command"]
    serve = compose["serving"]["command"]  # one scalable service behind the front door
    # the same, but for the console's name on each (its Service; its compose service)
    assert [a.replace("//mmc-console:", "//console:") for a in
            container(rendered, "mmc-serving")["command"]] == serve
