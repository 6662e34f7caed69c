#!/bin/sh
# The image's entrypoint: `make run` in the container (serve_app/launch.py: a local Ray instance
# and the platform on it) on SERVE_CONFIG, or on the config given as the first argument.
# Any other command (ray, serve, inference-admin, sh) runs as given, in the same environment:
# KubeRay and the cluster launcher start Ray themselves.
set -eu
config=${SERVE_CONFIG:-configs/local.yaml}
if [ $# -gt 0 ]; then
    case $1 in
        *.yaml|*.yml) config=$1; shift ;;
        *) exec "$@" ;;
    esac
fi
mkdir -p "${DATA_DIR:-/data}" 2>/dev/null || true
if [ ! -w "${DATA_DIR:-/data}" ]; then
    echo "DATA_DIR ${DATA_DIR:-/data} is not writable by uid $(id -u): mount a volume it owns" >&2
    exit 1
fi
exec python -m serve_app.launch "$config"
