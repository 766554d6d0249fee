# syntax=docker/dockerfile:1.7
# One image for the control plane, the workers and the statistics service:
#   docker run IMAGE control-plane | worker | statistics   (the `serving` CLI is the entrypoint)
# Triton itself runs from NVIDIA's tritonserver image (see deploy/docker-compose.yml, helm/serving).

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY serving ./serving
COPY registry ./registry
COPY preprocess ./preprocess
# nvidia-pytriton bundles a whole Triton server; it is only needed by `serving triton`
# (the embedded one). This image never runs that: Triton is its own container.
RUN pip install . && pip uninstall -y nvidia-pytriton

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG UID=10001
RUN groupadd --system --gid ${UID} serving \
 && useradd --system --uid ${UID} --gid serving --home-dir /var/lib/serving --no-log-init serving \
 && mkdir -p /var/lib/serving/artifacts /models \
 && chown -R serving:serving /var/lib/serving /models
COPY --from=build /opt/venv /opt/venv

# Probes the health endpoint of whichever component PID 1 (or the PID given) runs, on the
# port that component reads from its own settings class, so a changed SERVING_*_PORT is followed.
COPY --chmod=0755 <<'PY' /usr/local/bin/serving-healthcheck
#!/opt/venv/bin/python
import sys
import urllib.request

from serving.settings import ControlPlaneSettings, StatisticsSettings, WorkerSettings

pid = sys.argv[1] if len(sys.argv) > 1 else "1"
argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
probes = {
    "control-plane": lambda: [f"http://127.0.0.1:{ControlPlaneSettings().control_plane_port}/health"],
    "worker": lambda: [f"http://127.0.0.1:{WorkerSettings().worker_port}/v2/health/live"],
    "statistics": lambda: [f"http://127.0.0.1:{StatisticsSettings().statistics_port}/{p}"
                           for p in ("health", "metrics")],
}
command = next((a for a in argv if a in probes), None)
if command is None:  # a one-off CLI command: nothing to probe
    sys.exit(0)
for url in probes[command]():
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            if resp.status != 200:
                sys.exit(f"{url}: HTTP {resp.status}")
    except OSError as exc:
        sys.exit(f"{url}: {exc}")
PY

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SERVING_HOME=/var/lib/serving \
    SERVING_CONTROL_PLANE_HOST=0.0.0.0 \
    SERVING_WORKER_HOST=0.0.0.0 \
    SERVING_STATISTICS_HOST=0.0.0.0
USER ${UID}:${UID}
WORKDIR /var/lib/serving
# control plane, worker, statistics (defaults of SERVING_*_PORT)
EXPOSE 8080 9090 9999
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 CMD ["serving-healthcheck"]
ENTRYPOINT ["serving"]
CMD ["control-plane"]
