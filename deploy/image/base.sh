#!/bin/sh
# Base images for `make image-check` where no registry is reachable: Debian bookworm's minbase
# (debootstrap, from Debian's own mirror) with Python 3.11 stands in for python:3.11-slim-bookworm,
# and the same with this machine's Node.js stands in for node:22-bookworm-slim (the console's
# build stage). Each is built once and cached: the root file system under $CACHE, the images in
# the local container storage.
#   deploy/image/base.sh PYTHON_IMAGE NODE_IMAGE
set -eu
python_image=$1
node_image=$2
cache=${CACHE:-.cache/image}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
rootfs=$cache/bookworm-rootfs

if ! podman image exists "$python_image"; then
    if [ ! -f "$rootfs/.complete" ]; then
        rm -rf "$rootfs"
        mkdir -p "$cache"
        # python3-venv: the image's environment is a venv; ca-certificates: pip and apt over TLS.
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$rootfs" "$mirror"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        touch "$rootfs/.complete"
    fi
    tar -C "$rootfs" --exclude=./.complete -c . | podman import - "$python_image"
fi

if ! podman image exists "$node_image"; then
    node=$(command -v node) || { echo "base.sh: the node image needs Node.js >= 20.19 here" >&2; exit 1; }
    # Node's binary and npm (NodeSource's layout, /usr/bin and /usr/lib/node_modules) on top.
    container=$(buildah from --pull-never "$python_image")
    buildah copy "$container" "$node" /usr/bin/node
    buildah copy "$container" "$(dirname "$(readlink -f "$(command -v npm)")")/.." /usr/lib/node_modules/npm
    buildah run --isolation chroot "$container" -- ln -sf ../lib/node_modules/npm/bin/npm-cli.js /usr/bin/npm
    buildah run --isolation chroot "$container" -- ln -sf ../lib/node_modules/npm/bin/npx-cli.js /usr/bin/npx
    buildah commit --quiet "$container" "$node_image"
    buildah rm "$container"
fi
