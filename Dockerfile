# syntax=docker/dockerfile:1.7
# One image for the control plane, the workers and the statistics service:
#   docker run IMAGE control-plane | worker | statistics   (the `serving` CLI is the entrypoint)
# Triton itself runs from NVIDIA's tritonserver image (see deploy/docker-compose.yml, helm/serving).
#
# BASE_IMAGE: any Debian bookworm with Python 3.11 (a shared libpython, python and python -m venv
# working). The default is the public image; scripts/images.sh builds one with debootstrap for
# machines with no registry and passes --build-arg BASE_IMAGE=localhost/serving-base:bookworm.
# --target embedded-triton: the same image plus nvidia-pytriton, for `serving triton` (the
# embedded Triton, python backend only), which the compose test runs in place of NVIDIA's image.

ARG PYTHON_VERSION=3.11
ARG BASE_IMAGE=python:${PYTHON_VERSION}-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
# The dependencies first, in a layer of their own that is rebuilt only when pyproject.toml
# changes (empty packages stand in for the code, which comes next).
# EXTRAS=gpu (docker build --build-arg EXTRAS=gpu): onnxruntime-gpu in place of onnxruntime, for
# workers running the onnxruntime engine on a GPU (both wheels ship the `onnxruntime` module).
ARG EXTRAS=""
RUN mkdir serving registry preprocess \
 && touch serving/__init__.py registry/__init__.py preprocess/__init__.py \
 && pip install ".${EXTRAS:+[$EXTRAS]}" \
 && case ",$EXTRAS," in *,gpu,*) pip uninstall -y onnxruntime \
      && pip install --no-deps --force-reinstall "onnxruntime-gpu>=1.17";; esac \
 && pip uninstall -y serving && rm -rf serving registry preprocess build ./*.egg-info
COPY serving ./serving
COPY registry ./registry
COPY preprocess ./preprocess
# nvidia-pytriton bundles a whole Triton server; it is only needed by `serving triton`
# (the embedded one). This image never runs that: Triton is its own container. A copy of its
# files is kept aside for the embedded-triton target (not in the default image).
RUN pip install --no-deps . \
 && case ",$EXTRAS," in *,torch,*) python -m serving.torchserve.install_hook;; esac \
 && site=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && mkdir -p "/opt/pytriton$site" \
 && cp -a "$site"/pytriton "$site"/nvidia_pytriton* "/opt/pytriton$site/" \
 && pip uninstall -y nvidia-pytriton

FROM ${BASE_IMAGE} AS runtime
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

# `serving triton` needs nvidia-pytriton: put it back where pip had installed it (in the venv's
# site-packages, where PyTriton looks for its bundled libraries); nothing else changes.
FROM runtime AS embedded-triton
COPY --from=build /opt/pytriton/ /

# The default target: the lean image.
FROM runtime
