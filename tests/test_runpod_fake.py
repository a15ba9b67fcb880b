"""The fake RunPod REST API (tests/helpers/fake_runpod.py) against RunPod's OpenAPI document.

Plain urllib against the fake, no CLI: requests built from the document's own examples are
accepted and answered to schema; requests the document refuses are refused and recorded; the
behaviour the operations' descriptions promise holds. And the vendored subset is the source's.
"""

import json
import urllib.error
import urllib.request

import pytest

from conftest import ROOT
from helpers.fake_runpod import FakeRunPod, spec
from helpers.vendor_runpod_openapi import OPERATIONS, refs, subset

SUBSET = ROOT / "tests" / "fixtures" / "runpod" / "openapi-v2-subset.json"
SOURCE = ROOT.parent / "shared" / "runpod" / "openapi-v2.json"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILXGDN/SclOozk1xsDztpmhGiKkkrfQB9SKoO8dSIQQZ me@example.com"


@pytest.fixture
def fake():
    with FakeRunPod() as f:
        yield f


def call(fake, method, path, body=None, key="account", raw=None, content_type="application/json"):
    """(status, headers, parsed JSON or text or None) of one request; key: 'account', None, or a key."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(fake.url + path, data=data, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {fake.key if key == 'account' else key}")
    if data is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            status, headers, text = response.status, response.headers, response.read().decode()
    except urllib.error.HTTPError as e:
        status, headers, text = e.code, e.headers, e.read().decode()
    if not text:
        return status, headers, None
    if headers.get_content_type() in ("application/json", "application/problem+json"):
        return status, headers, json.loads(text)
    return status, headers, text


def example(path, method):
    """The first example value the document gives for an operation's request body."""
    op = spec().doc["paths"][path][method]
    media = op["requestBody"]["content"]["application/json"]
    return json.loads(json.dumps(next(iter(media["examples"].values()))["value"]))


def cluster_example():
    """A createCluster body from the examples of CreateClusterRequest's properties."""
    schemas = spec().doc["components"]["schemas"]
    compute = {name: prop["examples"][0] for name, prop in schemas["ClusterCompute"]["properties"].items()}
    props = schemas["CreateClusterRequest"]["allOf"][1]["properties"]
    return {"name": props["name"]["examples"][0], "type": schemas["ClusterType"]["examples"][0],
            "compute": compute, "image": schemas["BaseContainerConfig"]["properties"]["image"]["examples"][0],
            "ports": ["22/tcp"], "startSsh": True}


def pod_body(**extra):
    body = example("/v2/pods", "post")  # an RTX 4090, which is not in the fake's secure cloud
    body.update(cloud="COMMUNITY", ports=["22/tcp"], startSsh=True)
    body.update(extra)
    return body


# ---- the vendored document


def test_vendored_subset_is_self_contained():
    doc = json.loads(SUBSET.read_text())
    assert doc["openapi"].startswith("3.1") and doc["x-source"]["commit"] == "a900806"
    assert {p: sorted(m for m in item if m != "parameters") for p, item in doc["paths"].items()} == \
           {p: sorted(ms) for p, ms in OPERATIONS.items()}
    for ref in refs(doc):
        _, _, kind, name = ref.split("/")
        assert name in doc["components"][kind], ref


def test_vendored_subset_matches_source():
    if not SOURCE.is_file():
        pytest.skip(f"RunPod's document is not here ({SOURCE})")
    source = json.loads(SOURCE.read_text())
    doc = json.loads(SUBSET.read_text())
    for path, item in doc["paths"].items():
        for key, value in item.items():
            assert value == source["paths"][path][key], f"{key} {path} differs from the source"
    for kind, entries in doc["components"].items():
        for name, value in entries.items():
            assert value == source["components"][kind][name], f"components/{kind}/{name} differs"
    regenerated = subset(source)
    assert {k: v for k, v in doc.items() if k != "x-source"} == regenerated, "rerun vendor_runpod_openapi.py"


# ---- valid requests, answered to schema


def test_create_pod_from_the_schema_example_and_its_lifecycle(fake):
    fake.ssh_keys = [KEY]
    fake.ssh_endpoints = [("10.0.0.5", 40100), ("10.0.0.6", 40200)]
    status, _, pod = call(fake, "POST", "/v2/pods", pod_body(env={"A": "1"}))
    assert status == 201 and pod["status"] == "PROVISIONING"
    assert pod["ssh"] == {"proxy": None, "direct": None} and pod["runtime"] is None
    assert pod["env"] == {"A": "1", "PUBLIC_KEY": KEY} and fake.pods[pod["id"]].public_key == KEY
    assert pod["cost"] == 0.34 and pod["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1}
    assert pod["actions"] == ["stop", "terminate"]
    status, _, second = call(fake, "POST", "/v2/pods", pod_body(name="second"))

    _, _, seen = call(fake, "GET", f"/v2/pods/{pod['id']}")
    assert seen["status"] == "STARTING" and seen["ssh"]["direct"] is None
    proxy = seen["ssh"]["proxy"]
    assert proxy["host"] == "ssh.runpod.io" and proxy["port"] == 22
    assert proxy["username"].startswith(pod["id"] + "-")
    _, _, seen = call(fake, "GET", f"/v2/pods/{pod['id']}")
    assert seen["status"] == "RUNNING" and seen["actions"] == ["stop", "restart", "terminate"]
    assert seen["ssh"]["direct"] == {"host": "10.0.0.5", "port": 40100, "username": "root",
                                     "command": "ssh root@10.0.0.5 -p 40100"}
    assert seen["runtime"]["ports"] == [{"private": 22, "public": 40100, "type": "tcp", "ip": "10.0.0.5"}]
    fake.ports_after = 0
    _, _, other = call(fake, "GET", f"/v2/pods/{second['id']}")
    assert other["ssh"]["direct"]["port"] == 40200  # round robin, in creation order

    _, _, listed = call(fake, "GET", "/v2/pods")
    assert sorted(p["id"] for p in listed["pods"]) == sorted([pod["id"], second["id"]])
    assert call(fake, "DELETE", f"/v2/pods/{pod['id']}")[::2] == (204, None)
    assert call(fake, "GET", f"/v2/pods/{pod['id']}")[2]["detail"] == "pod not found"
    assert [p["id"] for p in call(fake, "GET", "/v2/pods")[2]["pods"]] == [second["id"]]
    assert fake.alive() == [second["id"]]
    fake.check()


def test_pod_without_keys_or_ssh_port(fake):
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body(ports=["8888/http"]))
    assert "PUBLIC_KEY" not in pod["env"] and fake.pods[pod["id"]].public_key is None
    fake.ports_after = 0
    _, _, seen = call(fake, "GET", f"/v2/pods/{pod['id']}")
    assert seen["status"] == "RUNNING" and seen["ssh"]["direct"] is None  # no 22/tcp in ports
    fake.check()


def test_actions_stop_start_terminate(fake):
    fake.ports_after = 0
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body())
    call(fake, "GET", f"/v2/pods/{pod['id']}")
    status, _, stopped = call(fake, "POST", f"/v2/pods/{pod['id']}/action", {"action": "stop"})
    assert status == 200 and stopped["status"] == "EXITED" and stopped["cost"] == 0
    assert fake.alive() == [pod["id"]] and fake.billing() == []
    status, _, problem = call(fake, "POST", f"/v2/pods/{pod['id']}/action", {"action": "restart"})
    assert status == 409 and problem["status"] == 409
    assert call(fake, "POST", f"/v2/pods/{pod['id']}/action", {"action": "start"})[2]["status"] == "STARTING"
    assert call(fake, "POST", f"/v2/pods/{pod['id']}/action", {"action": "terminate"})[::2] == (204, None)
    assert fake.alive() == [] and fake.terminated == [pod["id"]]
    fake.check()


def test_terminated_visible(fake):
    fake.terminated_visible, fake.terminated_visible_gets = True, 2
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body())
    call(fake, "DELETE", f"/v2/pods/{pod['id']}")
    for _ in range(2):
        status, _, seen = call(fake, "GET", f"/v2/pods/{pod['id']}")
        assert status == 200 and seen["status"] == "TERMINATED" and seen["cost"] == 0
    assert call(fake, "GET", f"/v2/pods/{pod['id']}")[0] == 404
    assert call(fake, "GET", "/v2/pods")[2] == {"pods": []}
    fake.check()


def test_cluster_from_schema_examples(fake):
    fake.ssh_keys = [KEY]
    fake.ports_after = 0
    status, _, cluster = call(fake, "POST", "/v2/clusters", cluster_example())
    assert status == 201 and cluster["compute"]["podCount"] == 4 and cluster["pods"]["total"] == 4
    assert cluster["primary"]["status"] == "PROVISIONING" and "sshEndpoint" not in cluster["primary"]
    assert call(fake, "GET", "/v2/pods")[2] == {"pods": []}  # members hidden by default
    _, _, members = call(fake, "GET", f"/v2/clusters/{cluster['id']}/pods")
    pods = members["pods"]
    assert [p["cluster"]["rank"] for p in pods] == [0, 1, 2, 3]
    assert [p["cluster"]["ip"] for p in pods] == [f"10.65.0.{2 + r}" for r in range(4)]
    assert all(p["status"] == "RUNNING" and p["env"]["PUBLIC_KEY"] == KEY and p["actions"] == []
               and "role" not in p["cluster"] and p["cost"] == round(2.99 * 8, 4) for p in pods)
    assert len(call(fake, "GET", "/v2/pods?includeClusterPods=true")[2]["pods"]) == 4
    _, _, summary = call(fake, "GET", f"/v2/clusters/{cluster['id']}")
    assert summary["pods"]["byStatus"] == {"RUNNING": 4}
    assert summary["primary"] == {"podId": pods[0]["id"], "status": "RUNNING", "sshEndpoint": "127.0.0.1:40022"}

    member = pods[1]["id"]
    status, _, problem = call(fake, "DELETE", f"/v2/pods/{member}")
    assert status == 409 and "belongs to a cluster" in problem["detail"]
    assert call(fake, "POST", f"/v2/pods/{member}/action", {"action": "terminate"})[0] == 409
    assert call(fake, "GET", "/v2/clusters")[2]["clusters"][0]["id"] == cluster["id"]
    assert call(fake, "DELETE", f"/v2/clusters/{cluster['id']}")[0] == 204
    assert fake.alive() == [] and fake.clusters_alive() == []
    assert call(fake, "GET", f"/v2/clusters/{cluster['id']}")[0] == 404
    assert call(fake, "GET", f"/v2/pods/{member}")[0] == 404
    fake.check()


def test_slurm_roles_and_a_node_never_ready(fake):
    fake.ports_after, fake.never_ready_nodes = 0, {1}
    body = cluster_example()
    body.update(type="SLURM", compute={"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1, "podCount": 2})
    _, _, cluster = call(fake, "POST", "/v2/clusters", body)
    _, _, members = call(fake, "GET", f"/v2/clusters/{cluster['id']}/pods")
    assert [p["cluster"]["role"] for p in members["pods"]] == ["SLURM_CONTROLLER", "SLURM_COMPUTE"]
    assert [p["ssh"]["direct"] is not None for p in members["pods"]] == [True, False]
    fake.check()


# ---- requests the schema refuses


@pytest.mark.parametrize("method,path,body,where", [
    ("POST", "/v2/pods", pod_body(bogus=1), "bogus"),
    ("POST", "/v2/pods", {k: v for k, v in pod_body().items() if k != "name"}, "'name' is a required"),
    ("POST", "/v2/pods", pod_body(gpu={"id": "NVIDIA A40", "count": 0}), "$.gpu.count"),
    ("POST", "/v2/pods", {k: v for k, v in pod_body().items() if k != "image"}, "'image' is a required"),
    ("POST", "/v2/pods", pod_body(env={"N": 1}), "$.env.N"),
    ("POST", "/v2/clusters", {**cluster_example(), "compute": {"gpuTypeId": "NVIDIA A40", "gpuCountPerPod": 1,
                                                               "podCount": 1}}, "$.compute.podCount"),
    ("POST", "/v2/clusters", {**cluster_example(), "registry": "r1"}, "registry"),
    ("PUT", "/v2/account/ssh-keys", {"keys": ["not a key"]}, "$.keys[0]"),
    ("PUT", "/v2/account/ssh-keys", {"keys": [KEY], "extra": True}, "extra"),
    ("POST", "/v2/pods/abc/action", {"action": "explode"}, "$.action"),
])
def test_invalid_bodies_are_422_and_recorded(fake, method, path, body, where):
    status, headers, problem = call(fake, method, path, body)
    assert status == 422 and headers.get_content_type() == "application/problem+json"
    assert problem["title"] == "Unprocessable Entity" and problem["status"] == 422
    assert any(where in e for e in problem["errors"]), problem["errors"]
    assert len(fake.violations) == 1 and fake.response_violations == []
    assert fake.pods == {} and fake.clusters == {} and fake.ssh_keys == []
    with pytest.raises(AssertionError, match="422"):
        fake.check()


def test_cross_field_rules_are_400_and_recorded(fake):
    both = pod_body(cpu={"id": "cpu5c", "vcpuCount": 4})
    status, _, problem = call(fake, "POST", "/v2/pods", both)
    assert status == 400 and "exactly one of gpu or cpu" in problem["detail"]
    neither = {k: v for k, v in pod_body().items() if k != "gpu"}
    assert call(fake, "POST", "/v2/pods", neither)[0] == 400
    assert len(fake.violations) == 2 and fake.pods == {}


def test_query_parameters(fake):
    status, _, problem = call(fake, "GET", "/v2/pods?includeClusterPods=true&limit=3")
    assert status == 422 and any("query.limit" in e for e in problem["errors"])
    assert call(fake, "GET", "/v2/pods?includeClusterPods=yes")[0] == 422
    assert call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD&count=zero")[0] == 422
    assert call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD&product=CLUSTER")[0] == 422
    assert call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD,BOGUS")[0] == 422
    assert len(fake.violations) == 5
    fake.violations.clear()
    assert call(fake, "GET", "/v2/pods?includeClusterPods=false")[0] == 200
    assert call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD,CLUSTER&count=2")[0] == 200
    fake.check()


def test_routing_and_auth(fake):
    assert call(fake, "GET", "/v2/nothing")[0] == 404
    status, headers, _ = call(fake, "PATCH", "/v2/pods/abc", {"name": "x"})  # not in the subset
    assert status == 405 and headers["Allow"] == "GET, DELETE"
    assert len(fake.violations) == 2
    fake.violations.clear()
    status, _, problem = call(fake, "GET", "/v2/pods", key=None)
    assert status == 401 and problem["detail"] == "missing bearer token"
    assert call(fake, "GET", "/v2/pods", key="rpa_WRONG")[0] == 401
    fake.forbidden = True
    assert call(fake, "GET", "/v2/pods")[2] == {"title": "Forbidden", "status": 403, "detail": "access denied"}
    assert [r["key"] for r in fake.requests[-3:]] == [None, "unknown", "account"]
    assert call(fake, "POST", "/v2/pods", raw=b"{}", content_type="text/plain")[0] == 403
    fake.check()


# ---- catalog


def test_catalog(fake):
    _, _, plain = call(fake, "GET", "/v2/catalog/gpus")
    assert [g["id"] for g in plain["gpus"]] == ["NVIDIA H100 80GB HBM3", "NVIDIA A40", "NVIDIA GeForce RTX 4090"]
    assert all("availability" not in g for g in plain["gpus"])
    rtx = plain["gpus"][2]
    assert rtx["secure"] is False and rtx["price"] == {"secure": 0, "community": 0.34}
    assert rtx["maxCount"]["secure"] == 0

    status, _, problem = call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY")
    assert status == 400 and "product" in problem["detail"]
    assert call(fake, "GET", "/v2/catalog/gpus?product=POD")[0] == 400
    assert len(fake.violations) == 2
    fake.violations.clear()

    _, _, stock = call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD")
    assert [g["availability"] for g in stock["gpus"]] == ["HIGH", "HIGH", "NONE"]
    assert "dataCenters" not in stock["gpus"][2]
    _, _, stock = call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=COMMUNITY&count=9")
    assert [g["availability"] for g in stock["gpus"]] == ["NONE"] * 3
    fake.availability[("NVIDIA A40", "SECURE", "CLUSTER")] = "LOW"
    _, _, stock = call(fake, "GET", "/v2/catalog/gpus?include=AVAILABILITY&product=CLUSTER")
    assert stock["gpus"][1]["availability"] == "LOW"
    fake.check()


# ---- capacity and trouble


def test_capacity_and_availability(fake):
    fake.capacity = 3
    body = cluster_example()  # 4 pods
    status, _, problem = call(fake, "POST", "/v2/clusters", body)
    assert status == 400 and "no capacity" in problem["detail"] and fake.pods == {}
    assert call(fake, "POST", "/v2/pods", pod_body())[0] == 201 and fake.capacity == 2
    fake.availability[("NVIDIA GeForce RTX 4090", "COMMUNITY", "POD")] = "NONE"
    assert call(fake, "POST", "/v2/pods", pod_body())[0] == 400
    assert call(fake, "POST", "/v2/pods", example("/v2/pods", "post"))[0] == 400  # 4090, SECURE cloud
    assert fake.violations == []  # no capacity is not the client's fault
    fake.check()


def test_fail_and_lose_creates_fail_deletes(fake):
    fake.fail_create = 1
    assert call(fake, "POST", "/v2/pods", pod_body())[0] == 500 and fake.pods == {}
    fake.lose_create_answer = True
    status, headers, text = call(fake, "POST", "/v2/pods", pod_body())
    assert status == 502 and text == "Bad Gateway" and len(fake.alive()) == 1
    fake.lose_create_answer = False
    fake.fail_delete = 1
    pod_id = fake.alive()[0]
    assert call(fake, "DELETE", f"/v2/pods/{pod_id}")[0] == 500 and fake.alive() == [pod_id]
    assert call(fake, "DELETE", f"/v2/pods/{pod_id}")[0] == 204 and fake.alive() == []
    fake.check()


def test_rate_limit_carries_retry_after(fake):
    fake.rate_limit, fake.retry_after = 1, 7
    status, headers, problem = call(fake, "GET", "/v2/pods")
    assert status == 429 and headers["Retry-After"] == "7" and problem["status"] == 429
    assert call(fake, "GET", "/v2/pods")[0] == 200
    fake.server_error = True
    assert call(fake, "GET", "/v2/pods")[0] == 500
    assert [r["status"] for r in fake.requests] == [429, 200, 500]
    fake.check()


# ---- keys


def test_ssh_keys(fake):
    assert call(fake, "GET", "/v2/account/ssh-keys")[2] == {"keys": []}
    assert call(fake, "PUT", "/v2/account/ssh-keys", {"keys": [KEY, KEY + "2"]})[2] == {"keys": [KEY, KEY + "2"]}
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body())
    assert pod["env"]["PUBLIC_KEY"] == f"{KEY}\n{KEY}2"
    _, _, own = call(fake, "POST", "/v2/pods", pod_body(env={"PUBLIC_KEY": "ssh-rsa MINE"}))
    assert own["env"]["PUBLIC_KEY"] == "ssh-rsa MINE"
    assert call(fake, "PUT", "/v2/account/ssh-keys", {"keys": []})[2] == {"keys": []}
    fake.check()


def test_pod_keys(fake):
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body())
    _, _, other = call(fake, "POST", "/v2/pods", pod_body(name="other"))
    _, _, cluster = call(fake, "POST", "/v2/clusters", cluster_example())
    mine = fake.pod_key(pod["id"])
    forbidden = {"title": "Forbidden", "status": 403, "detail": "access denied"}
    assert call(fake, "GET", f"/v2/pods/{pod['id']}", key=mine)[0] == 200
    assert call(fake, "GET", f"/v2/pods/{other['id']}", key=mine)[2] == forbidden
    assert call(fake, "GET", "/v2/pods", key=mine)[0] == 403
    assert call(fake, "POST", "/v2/pods", pod_body(), key=mine)[0] == 403
    assert call(fake, "GET", "/v2/account/ssh-keys", key=mine)[0] == 403
    assert call(fake, "DELETE", f"/v2/clusters/{cluster['id']}", key=mine)[0] == 403
    assert call(fake, "POST", f"/v2/pods/{pod['id']}/action", {"action": "stop"}, key=mine)[0] == 200
    assert call(fake, "DELETE", f"/v2/pods/{pod['id']}", key=mine)[0] == 204
    assert fake.requests[-1]["key"] == f"pod:{pod['id']}"

    member = fake.clusters[cluster["id"]].pod_ids[1]
    fake.pod_key_may_delete_cluster = False
    assert call(fake, "DELETE", f"/v2/clusters/{cluster['id']}", key=fake.pod_key(member))[0] == 403
    fake.pod_key_may_delete_cluster = True
    assert call(fake, "DELETE", f"/v2/clusters/{cluster['id']}", key=fake.pod_key(member))[0] == 204
    assert fake.alive() == [other["id"]]
    fake.check()


def test_pod_environ_and_console_deletes(fake, tmp_path):
    fake.environ_dir = tmp_path / "environ"
    _, _, pod = call(fake, "POST", "/v2/pods", pod_body(env={"A": "1"}))
    _, _, cluster = call(fake, "POST", "/v2/clusters", cluster_example())
    environ = dict(line.split("=", 1) for line in
                   (tmp_path / "environ" / pod["id"]).read_bytes().decode().split("\0") if line)
    assert environ["RUNPOD_API_KEY"] == fake.pod_key(pod["id"]) and environ["A"] == "1"
    assert environ["RUNPOD_POD_ID"] == pod["id"]
    member = fake.clusters[cluster["id"]].pod_ids[3]
    assert b"NODE_RANK=3\0" in (tmp_path / "environ" / member).read_bytes()
    fake.delete_pod(pod["id"])
    fake.delete_cluster(cluster["id"])
    assert fake.alive() == [] and fake.clusters_alive() == [] and fake.requests[-1]["op"] == "createCluster"
    assert call(fake, "GET", f"/v2/pods/{pod['id']}")[0] == 404
    fake.check()


# ---- the fake's own answers are checked


def test_seeded_resources_and_a_response_violation(fake):
    pod_id = fake.add_pod("lost-pod")
    cluster_id = fake.add_cluster("lost-cluster", 2)
    assert call(fake, "GET", f"/v2/pods/{pod_id}")[2]["ssh"]["direct"]["port"] == 40099
    _, _, members = call(fake, "GET", f"/v2/clusters/{cluster_id}/pods")
    assert [p["ssh"]["direct"]["port"] for p in members["pods"]] == [40100, 40101]
    assert len(fake.alive()) == 3 and fake.clusters_alive() == [cluster_id]
    fake.check()
    fake.catalog[0]["memory"] = "80 GB"  # the fake now answers against its schema
    assert call(fake, "GET", "/v2/catalog/gpus")[0] == 200
    assert fake.violations == [] and any("memory" in v for v in fake.response_violations)
    with pytest.raises(AssertionError, match="the fake's bug"):
        fake.check()
