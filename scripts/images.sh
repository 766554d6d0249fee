#!/usr/bin/env bash
# Build the project's container images with no image registry at all.
#
#   scripts/images.sh            base image (cached), serving:latest, serving-triton:latest,
#                                and the stand-in images the compose test uses
#   scripts/images.sh --base     only the base image
#   scripts/images.sh --prune    remove untagged images (older builds, the layer cache)
#   scripts/images.sh --vllm     only $SERVING_VLLM_IMAGE (serving-vllm-cpu:latest): vLLM's CPU build, the
#                                engine image of the chart's llmEngines without a GPU (deploy/vllm-cpu/)
#
# 1. A Debian bookworm base image made here: debootstrap (from Debian's mirror) with Debian's
#    python3.11 (shared libpython, which Triton's Python-backend stub loads), then imported as
#    an image. It is built only when missing: the engine's copy, else a tarball cached under
#    $SERVING_IMAGE_CACHE (default ~/.cache/serving-images), else debootstrap.
# 2. The project's image from ./Dockerfile, with the base named by --build-arg BASE_IMAGE
#    (the Dockerfile's default stays python:3.11-slim-bookworm for users with a registry),
#    and its embedded-Triton target (the test's stand-in for NVIDIA's tritonserver image).
# 3. The stand-ins for public images (deploy/stand-ins/Dockerfile): PostgreSQL, Prometheus
#    and nginx from Debian's packages, a Kafka-protocol broker (Tansu, from PyPI).
#
# Environment: CONTAINER_ENGINE (podman, or docker), SERVING_IMAGE (serving:latest),
# SERVING_TRITON_IMAGE (serving-triton:latest), SERVING_STANDIN_PREFIX (serving-standin) and
# SERVING_STANDIN_TAG (latest) for the stand-ins' names, e.g. tags of one test run's own, so that
# builds from other checkouts on the same engine cannot swap its images;
# SERVING_BASE_IMAGE (localhost/serving-base:bookworm), SERVING_IMAGE_CACHE, DEBIAN_MIRROR,
# SERVING_BUILD_NETWORK (podman build --network; default host, see below).
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE=${CONTAINER_ENGINE:-podman}
BASE=${SERVING_BASE_IMAGE:-localhost/serving-base:bookworm}
IMAGE=${SERVING_IMAGE:-serving:latest}
TRITON_IMAGE=${SERVING_TRITON_IMAGE:-serving-triton:latest}
VLLM_IMAGE=${SERVING_VLLM_IMAGE:-serving-vllm-cpu:latest}
STANDIN_PREFIX=${SERVING_STANDIN_PREFIX:-serving-standin}
STANDIN_TAG=${SERVING_STANDIN_TAG:-latest}
CACHE=${SERVING_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/serving-images}
SUITE=bookworm
# python3.11-venv brings ensurepip (pip inside the build); libpython3.11 is the shared library.
# debootstrap resolves no virtual packages: python3-distutils provides python3.11-distutils.
BASE_PACKAGES=python3.11,python3.11-venv,python3-distutils,libpython3.11,python-is-python3,ca-certificates
MIRROR=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
LOCAL_CAS=$(ls /usr/local/share/ca-certificates/*.crt 2>/dev/null | sort | tr '\n' ' ' || true)

if [ "$ENGINE" = podman ]; then
  # This machine's podman needs runc and lower ulimits (deploy/containers.conf); a user's own
  # CONTAINERS_CONF wins. The build network: host, so pip and apt inside RUN reach the network
  # without depending on a bridge/NAT set-up (override with SERVING_BUILD_NETWORK=bridge).
  export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/containers.conf}
  # --format docker: OCI image configs have no HEALTHCHECK, and buildah would drop the Dockerfile's.
  BUILD_ARGS=(--format docker --network "${SERVING_BUILD_NETWORK:-host}")
else
  BUILD_ARGS=()
fi

log() { printf '== %s\n' "$*" >&2; }
has_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

build_base() {
  if has_image "$BASE"; then
    log "base image $BASE: present"
    return
  fi
  local key tarball
  key=$( { printf '%s %s %s' "$SUITE" "$BASE_PACKAGES" "$(uname -m)"; cat $LOCAL_CAS 2>/dev/null; } | sha256sum | cut -c1-12)
  tarball="$CACHE/base-$SUITE-$key.tar"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    [ "$(id -u)" = 0 ] || { echo "debootstrap needs root" >&2; exit 1; }
    log "debootstrap $SUITE from $MIRROR (first time only: a few minutes)"
    local root
    mkdir -p "$CACHE"
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
      cp "$root/debootstrap/debootstrap.log" "$CACHE/debootstrap-inner.log" 2>/dev/null || true
      rm -rf "$root"
      tail -n 30 "$CACHE/debootstrap.log" >&2
      exit 1
    fi
    # This machine's own certificate authorities (e.g. a TLS-inspecting egress proxy's), so pip
    # and apt inside the builds trust what the host trusts.
    if [ -n "$LOCAL_CAS" ]; then
      cp $LOCAL_CAS "$root/usr/local/share/ca-certificates/"
      chroot "$root" update-ca-certificates >/dev/null
    fi
    # apt inside later builds: the same mirror (security updates too); keep the image small.
    printf 'deb %s %s main\ndeb %s %s-updates main\n' "$MIRROR" "$SUITE" "$MIRROR" "$SUITE" >"$root/etc/apt/sources.list"
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
           "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* "$root"/var/log/*
    tar --numeric-owner --xattrs -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  log "importing $tarball as $BASE"
  "$ENGINE" import -q --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$tarball" "$BASE" >/dev/null
}

# podman 4.3 (Debian bookworm) bundles buildah 1.28, which predates heredocs in Dockerfiles
# (buildah 1.33). For such builders the Dockerfile's `COPY --chmod=M <<'X' /path` blocks are
# rewritten into the equivalent `RUN` (same bytes, same mode) in a temporary copy.
dockerfile_for_engine() {
  local src=$1 out
  if [ "$ENGINE" != podman ] || buildah_has_heredocs; then
    printf '%s' "$src"
    return
  fi
  out=$(mktemp "${TMPDIR:-/tmp}/Dockerfile.XXXXXX")
  python3 - "$src" "$out" <<'PYEOF'
import base64, re, sys
text = open(sys.argv[1]).read()
pattern = re.compile(r"^COPY((?: --\S+)*) <<'?(\w+)'? (\S+)\n(.*?)\n\2$", re.M | re.S)
def rewrite(m):
    flags, _, dest, body = m.groups()
    mode = re.search(r"--chmod=(\d+)", flags or "")
    data = base64.b64encode((body + "\n").encode()).decode()
    chmod = f" && chmod {mode.group(1)} {dest}" if mode else ""
    return f"RUN echo {data} | base64 -d > {dest}{chmod}"
open(sys.argv[2], "w").write(pattern.sub(rewrite, text))
PYEOF
  printf '%s' "$out"
}

buildah_has_heredocs() {
  local v
  v=$(podman version --format '{{.Client.Version}}' 2>/dev/null || echo 0)
  # podman 4.8 is the first release on buildah 1.33
  [ "$(printf '%s\n4.8.0\n' "$v" | sort -V | head -n1)" = 4.8.0 ]
}

build_project() {
  local df
  df=$(dockerfile_for_engine Dockerfile)
  log "building $IMAGE from Dockerfile (BASE_IMAGE=$BASE)"
  "$ENGINE" build "${BUILD_ARGS[@]}" -f "$df" --build-arg BASE_IMAGE="$BASE" -t "$IMAGE" .
  log "building $TRITON_IMAGE (target embedded-triton)"
  "$ENGINE" build "${BUILD_ARGS[@]}" -f "$df" --build-arg BASE_IMAGE="$BASE" --target embedded-triton -t "$TRITON_IMAGE" .
  [ "$df" = Dockerfile ] || rm -f "$df"
}

build_standins() {
  local target
  for target in postgres kafka prometheus gateway; do
    log "building stand-in $STANDIN_PREFIX-$target:$STANDIN_TAG"
    "$ENGINE" build "${BUILD_ARGS[@]}" -f deploy/stand-ins/Dockerfile --build-arg BASE_IMAGE="$BASE" \
      --target "$target" -t "$STANDIN_PREFIX-$target:$STANDIN_TAG" deploy/stand-ins
  done
}

build_vllm() {
  # torch's CPU wheel from this machine's wheel folder when it has one (pip.conf's find-links), so the
  # build takes it rather than the index's
  local wheels
  wheels=$(pip3 config get global.find-links 2>/dev/null || true)
  local mount=()
  [ -n "$wheels" ] && [ -d "$wheels" ] && mount=(-v "$wheels:/wheels:ro")
  log "building $VLLM_IMAGE from deploy/vllm-cpu/Dockerfile"
  "$ENGINE" build "${BUILD_ARGS[@]}" "${mount[@]}" -f deploy/vllm-cpu/Dockerfile --build-arg BASE_IMAGE="$BASE" \
    -t "$VLLM_IMAGE" deploy/vllm-cpu
}

case "${1:-}" in
  --base) build_base; exit 0 ;;
  --vllm) build_base; build_vllm; exit 0 ;;
  --prune)
    # Untagged images: earlier builds of these tags and the build cache (the next build is a first one).
    "$ENGINE" image prune -f >/dev/null
    exit 0 ;;
esac
build_base
build_project
build_standins
log "images: $BASE $IMAGE $TRITON_IMAGE $STANDIN_PREFIX-{postgres,kafka,prometheus,gateway}:$STANDIN_TAG"
