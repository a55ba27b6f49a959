#!/usr/bin/env bash
# Build the Dockerfile where no container registry can be reached, and run the image the way
# the manifests do. Needs root, Debian's package archive and PyPI (docs/operations.md).
#
#   1. a Python base from Debian's own packages (debootstrap bookworm + python3, python3-venv),
#      committed by buildah as $BASE — it stands in for python:3.11-slim-bookworm;
#   2. `buildah bud` of the Dockerfile on that base, tagged $IMAGE;
#   3. the image run as UID/GID 65532 on a read-only root with a tmpfs /tmp (as the manifests'
#      securityContext and emptyDir have it): --version, rules check, the demo with its plot.
#
# Usage: scripts/image-without-registry.sh [IMAGE]   (default: `make -s image-name`)
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${1:-$(make -s image-name)}"
BASE="${BASE:-localhost/debian-python:3.11-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
WORK="$(mktemp -d)"
export BUILDAH_ISOLATION=chroot

need() { command -v "$1" >/dev/null || { echo "missing $1: apt-get install buildah debootstrap"; exit 1; }; }
need buildah
need debootstrap

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  echo "== base $BASE from Debian packages"
  debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3,ca-certificates \
    bookworm "$WORK/rootfs" "$MIRROR" >"$WORK/debootstrap.log"
  rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"*
  ctr="$(buildah from scratch)"
  cp -a "$WORK/rootfs/." "$(buildah mount "$ctr")/"
  buildah umount "$ctr" >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$ctr"
  buildah commit -q "$ctr" "$BASE" >/dev/null
  buildah rm "$ctr" >/dev/null
fi

echo "== buildah bud -t $IMAGE"
# pip in the build container trusts the host's CA bundle (for a TLS-inspecting proxy).
printf '[global]\ncert = /etc/ssl/host-ca.crt\n' >"$WORK/pip.conf"
buildah bud -q --network host \
  -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/host-ca.crt:ro \
  -v "$WORK/pip.conf:/etc/pip.conf:ro" \
  --build-arg PYTHON_IMAGE="$BASE" -t "$IMAGE" . >/dev/null

echo "== run as 65532 on a read-only root"
ctr="$(buildah from -q "$IMAGE")"
root="$(buildah mount "$ctr")"
mkdir -m 1777 -p "$WORK/out"
cleanup() { buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true; }
trap cleanup EXIT
unshare -m sh -c "
  mount --bind '$root' '$root' && mount -o remount,bind,ro '$root' &&
  mount -t tmpfs -o mode=1777 tmpfs '$root/tmp' && mount --bind /dev '$root/dev' &&
  mount -t proc proc '$root/proc' && mount --bind '$WORK/out' '$root/mnt' &&
  chroot --userspec=65532:65532 '$root' /usr/bin/env -i PATH=/opt/defrag/bin:/usr/bin:/bin \
    PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp HOME=/tmp sh -ec '
      cd /tmp
      if touch /opt/probe 2>/dev/null; then echo \"root filesystem is writable\"; exit 1; fi
      ! command -v pip >/dev/null && ! command -v cc >/dev/null && ! command -v gcc >/dev/null
      defrag --version
      defrag rules check
      defrag demo --plot /tmp/demo.png -o json > /tmp/demo.json
      cp /tmp/demo.png /tmp/demo.json /mnt/
    '
"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['train_llm_node'], d" \
  "$WORK/out/demo.json"
echo "OK: $IMAGE built and ran read-only as 65532 (demo plot: $WORK/out/demo.png)"
