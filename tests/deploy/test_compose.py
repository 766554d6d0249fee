"""deploy/docker-compose.yml (and the GPU override) against the Compose specification.

Tool: the ``compose-spec`` package (Python bindings of the Rust ``compose_spec`` crate, a
typed model of the Compose Specification that rejects unknown keys and malformed
values), fed the file after Compose's own interpolation of deploy/.env. Where CI runs
there is no container engine, so nothing here builds an image or starts a container.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.artifacts import DEPLOY, REPO, compose, compose_env, host_port, service_env
from tests.deploy.compose_env import InterpolationError, interpolate_str
from tests.support.ci import cannot_run

FILES = ["docker-compose.yml", "docker-compose.gpu.yml", "docker-compose.llm.yml"]
OUR_SERVICES = ("control-plane", "worker", "statistics")


def validate(doc: dict) -> None:
    import compose_spec

    compose_spec.PyCompose.from_yaml(yaml.safe_dump(doc)).validate()


@pytest.mark.parametrize("name", FILES)
def test_compose_file_matches_the_specification(name):
    validate(compose(name))


@pytest.mark.parametrize("mutate", [
    lambda d: d["services"]["worker"].update(scale_to=3),                       # unknown key
    lambda d: d["services"]["worker"]["depends_on"]["triton"].update(condition="service_up"),
    lambda d: d["services"]["postgres"].update(image="postgres:16 alpine"),     # not an image reference
    lambda d: d["services"]["triton"].update(ulimits={"memlock": "lots"}),
])
def test_the_specification_check_can_fail(mutate):
    doc = compose()
    mutate(doc)
    with pytest.raises(ValueError):
        validate(doc)


def test_interpolation_follows_compose_rules():
    env = {"A": "1", "EMPTY": ""}
    assert interpolate_str("${A}-${B:-x}-${EMPTY:-y}-${EMPTY-z}-$$A-$A", env) == "1-x-y--$A-1"
    with pytest.raises(InterpolationError):
        interpolate_str("${EMPTY:?needed}", env)
    with pytest.raises(InterpolationError):
        interpolate_str("${NOT_SET}", env)


def test_every_env_file_setting_is_used_and_every_variable_is_defined():
    used: set[str] = set()
    for name in FILES:
        compose(name, used)  # raises on a ${VAR} that .env does not define and has no default
    # COMPOSE_* settings are read by Compose itself (COMPOSE_PROFILES), not by the files
    settings = {k for k in compose_env() if not k.startswith("COMPOSE_")}
    assert settings <= used, f"unused in the compose files: {settings - used}"


def test_every_service_has_an_image_and_ours_build_from_the_dockerfile():
    services = compose()["services"]
    for name, svc in services.items():
        assert re.fullmatch(r"[a-z0-9./:_-]+", svc["image"]), (name, svc["image"])
    for name in OUR_SERVICES:
        assert services[name]["build"]["context"] == ".."
        assert (DEPLOY / services[name]["build"]["context"] / services[name]["build"]["dockerfile"]).is_file()
        assert services[name]["image"] == compose_env()["SERVING_IMAGE"]
    assert services["triton"]["image"].startswith("nvcr.io/nvidia/tritonserver:")
    assert services["triton"]["image"].endswith("-py3")


def mounts(service: dict) -> dict[str, str]:
    """Container path -> host path of a service's bind mounts (short and long syntax)."""
    out = {}
    for spec in service.get("volumes", []):
        if isinstance(spec, dict):
            out[spec["target"]] = spec["source"]
        else:
            source, target = spec.split(":")[:2]
            out[target] = source
    return out


def nginx_conf(service: dict) -> str:
    """The service's conf.d file with the files it includes inlined, as nginx reads them."""
    files = mounts(service)
    text = (DEPLOY / files["/etc/nginx/conf.d/default.conf"]).read_text()
    return re.sub(r"include (\S+);", lambda m: (DEPLOY / files[m.group(1)]).read_text(), text)


def test_workers_scale_no_fixed_name_or_host_port_and_one_gateway_in_front():
    services = compose()["services"]
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker
    assert not any("container_name" in s for s in services.values())
    port = service_env(worker)["SERVING_WORKER_PORT"]
    for name in ("gateway", "gateway-http"):
        conf = nginx_conf(services[name])
        assert f"set $workers worker:{port};" in conf and "proxy_pass http://$workers;" in conf
        assert "resolver 127.0.0.11" in conf, "re-resolve so added replicas get traffic"
        assert "proxy_set_header X-Forwarded-Proto $scheme;" in conf
    grpc_port = service_env(worker)["SERVING_WORKER_GRPC_PORT"]
    conf = nginx_conf(services["gateway"])
    assert f"set $grpc_workers worker:{grpc_port};" in conf and "grpc_pass grpc://$grpc_workers;" in conf
    assert conf.count("resolver 127.0.0.11") == 2  # each server block re-resolves
    assert grpc_port in worker["expose"]


def test_the_gateway_serves_https_only_and_plain_http_only_when_asked():
    services = compose()["services"]
    gateway = services["gateway"]
    conf = nginx_conf(gateway)
    servers = conf.split("server {")[1:]
    assert [re.findall(r"listen ([^;]+);", s) for s in servers] == [["9090 ssl"], ["9443 ssl http2"]]
    assert gateway["ports"] == [f"{compose_env()['WORKER_GATEWAY_PORT']}:9090",
                                f"{compose_env()['WORKER_GATEWAY_GRPC_PORT']}:9443"]
    files = mounts(gateway)
    for server in servers:  # each with the mounted certificate and key
        cert = re.search(r"ssl_certificate (\S+);", server).group(1)
        key = re.search(r"ssl_certificate_key (\S+);", server).group(1)
        assert files[cert] == compose_env()["GATEWAY_TLS_CERT"] and files[key] == compose_env()["GATEWAY_TLS_KEY"]
        assert re.search(r"ssl_protocols TLSv1\.2 TLSv1\.3;", server)
    for spec in gateway["volumes"]:
        if isinstance(spec, dict):  # a missing certificate fails the start, never becomes a directory
            assert spec["bind"]["create_host_path"] is False and spec["read_only"] is True, spec
    # the one other service in front of the workers is plain HTTP behind a profile, on loopback
    # unless the setting says otherwise
    fronts = {n for n, s in services.items() if "/etc/nginx/conf.d/default.conf" in mounts(s)}
    assert fronts == {"gateway", "gateway-http"}
    plain = services["gateway-http"]
    assert plain["profiles"] == ["plain-http"] and compose_env()["COMPOSE_PROFILES"] == ""
    assert re.findall(r"listen ([^;]+);", nginx_conf(plain)) == ["9080"]
    assert plain["ports"] == [f"{compose_env()['WORKER_GATEWAY_HTTP_PORT']}:9080"]
    assert compose_env()["WORKER_GATEWAY_HTTP_PORT"].startswith("127.0.0.1:")


def test_the_gateway_serves_the_console_from_the_control_plane_unbuffered():
    """/console (pages, static files, server-sent events) through the HTTPS gateway to the control plane,
    with no buffering (live updates and the playground's chat stream); not on the plain-HTTP gateway."""
    services = compose()["services"]
    conf = nginx_conf(services["gateway"])
    https = conf.split("server {")[1]  # the 9090 server
    location = re.search(r"location /console \{(.*?)\n\}", https, re.S)
    assert location, "no location /console in the HTTPS server"
    body = location.group(1)
    cp_port = service_env(services["control-plane"])["SERVING_CONTROL_PLANE_PORT"]
    assert f"set $control_plane control-plane:{cp_port};" in body and "proxy_pass http://$control_plane;" in body
    for line in ("proxy_buffering off;", "proxy_http_version 1.1;", 'proxy_set_header Connection "";',
                 "proxy_set_header X-Forwarded-Proto $scheme;"):
        assert line in body, line
    assert int(re.search(r"proxy_read_timeout (\d+)s;", body).group(1)) > 15  # the events' keepalive period
    assert "resolver 127.0.0.11" in https.split("location")[0]  # control-plane re-resolved, as workers
    assert "/console" not in nginx_conf(services["gateway-http"])  # tokens never over plain HTTP


def test_state_lives_on_named_volumes():
    doc = compose()
    declared = set(doc["volumes"])
    state = {"postgres": "/var/lib/postgresql/data", "kafka": "/var/lib/kafka/data",
             "control-plane": service_env(doc["services"]["control-plane"])["SERVING_HOME"],
             "statistics": service_env(doc["services"]["statistics"])["SERVING_HOME"],
             "prometheus": "/prometheus", "grafana": "/var/lib/grafana"}
    for name, path in state.items():
        sources = [v.split(":")[0] for v in doc["services"][name]["volumes"] if v.split(":")[1] == path]
        assert sources and sources[0] in declared, (name, path)
    generated = {compose_env()["GATEWAY_TLS_CERT"], compose_env()["GATEWAY_TLS_KEY"]}  # by init-env.sh
    for svc in doc["services"].values():
        for source in mounts(svc).values():
            assert source in declared | generated or (DEPLOY / source).exists(), f"missing {source}"


def test_kafka_runs_in_kraft_mode():
    env = compose()["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in k for k in env)
    assert env["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"


def test_gpu_override_reserves_the_gpu_for_triton_only():
    override = compose("docker-compose.gpu.yml")["services"]
    assert set(override) == {"triton"}
    (device,) = override["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_prometheus_scrapes_statistics_and_triton_with_the_alerts_job_name():
    doc = compose()
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in prom["scrape_configs"]}
    stats_port = int(service_env(doc["services"]["statistics"])["SERVING_STATISTICS_PORT"])
    alerts = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    for job in set(re.findall(r'job="([^"]+)"', alerts)):
        assert job in jobs, f"alerts.yml selects job {job!r}, which nothing scrapes"
    assert [host_port(t) for t in jobs["serving-statistics"]] == [("statistics", stats_port)]
    metrics_port = [a for a in doc["services"]["triton"]["command"] if a.startswith("--metrics-port=")]
    assert [host_port(t) for t in jobs["triton"]] == [("triton", int(metrics_port[0].split("=")[1]))]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in doc["services"]["prometheus"]["volumes"]}
    for rule_file in prom["rule_files"]:
        assert (DEPLOY / mounts[rule_file]).resolve() == (DEPLOY / "prometheus" / "alerts.yml").resolve()


def test_promtool_accepts_the_prometheus_config_and_rules(tmp_path: Path):
    if shutil.which("promtool") is None:
        cannot_run("promtool (Debian: prometheus, which scripts/setup.sh installs) is not installed")
    config = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/alerts.yml", "alerts.yml"))
    result = subprocess.run(["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = sum(len(g["rules"]) for g in yaml.safe_load((tmp_path / "alerts.yml").read_text())["groups"])
    assert f"SUCCESS: {rules} rules found" in result.stdout, result.stdout


def test_grafana_gets_the_shipped_provisioning_and_dashboards():
    doc = compose()
    mounts = {v.split(":")[1]: (DEPLOY / v.split(":")[0]).resolve() for v in doc["services"]["grafana"]["volumes"]
              if v.startswith(".")}
    provisioning = REPO / "grafana" / "provisioning"
    assert mounts["/etc/grafana/provisioning/datasources"] == provisioning / "datasources"
    assert mounts["/etc/grafana/provisioning/dashboards"] == provisioning / "dashboards"
    providers = yaml.safe_load(next((provisioning / "dashboards").glob("*.y*ml")).read_text())["providers"]
    assert mounts[providers[0]["options"]["path"]] == REPO / "grafana" / "dashboards"
    datasource = yaml.safe_load(next((provisioning / "datasources").glob("*.y*ml")).read_text())["datasources"][0]
    host, port = host_port(datasource["url"])
    assert host in doc["services"] and "--config.file=/etc/prometheus/prometheus.yml" in doc["services"][host]["command"]
    assert port == 9090  # Prometheus's listen port inside its container


def test_llm_override_runs_vllms_image_on_the_gpu_as_an_external_engine():
    """The workers reach it as vllm:8000 (an endpoint's url); its folder is the one registered."""
    services = compose("docker-compose.llm.yml")["services"]
    assert set(services) == {"vllm"}
    vllm = services["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:v")
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    args = dict(a.removeprefix("--").split("=", 1) for a in vllm["command"])
    assert args["port"] == "8000" and args["host"] == "0.0.0.0" and args["model"] == "/models/llm"
    assert mounts(vllm)["/models/llm"] == compose_env()["LLM_MODEL_DIR"]
    assert args["served-model-name"] == compose_env()["LLM_SERVED_MODEL_NAME"]
    assert host_port(vllm["ports"][0].rsplit(":", 1)[0]) == ("127.0.0.1", int(compose_env()["VLLM_PORT"]))
    from serving.llm.checks import check_options

    assert check_options({"url": "http://vllm:8000/v1", "served_model_name": args["served-model-name"]})
