#!/bin/sh
# Builds tunehub's images with buildah (no daemon, no BuildKit frontend) from the repository root.
#
#   images/build.sh [hub|notebook|trial ...]        (default: all three)
#
# Environment:
#   REGISTRY      image name prefix (default: ghcr.io/tunehub, what helm/tunehub/values.yaml names)
#   TAG           image tag                                   (default: 0.1.0)
#   PYTHON_IMAGE  base of the hub image and of the wheel-building stage (default in the Dockerfile:
#                 python:3.12.8-slim-bookworm; pass a digest for production)
#   TF_IMAGE      base of the notebook and trial images (default in the Dockerfiles:
#                 tensorflow/tensorflow:2.21.0-gpu; pass a digest for production)
#   CA_BUNDLE     a CA bundle file bind-mounted at /etc/ssl/certs/ca-certificates.crt for the
#                 RUN steps only (networks that re-sign TLS); it never ends up in an image
#   BUILDAH_BUD_FLAGS  more `buildah bud` flags
# Storage is buildah's default unless CONTAINERS_STORAGE_CONF names another storage.conf.
# Push afterwards with:  buildah push $REGISTRY/hub:$TAG   (or docker build/push: README.md)
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
registry=${REGISTRY:-ghcr.io/tunehub}
tag=${TAG:-0.1.0}
[ $# -gt 0 ] || set -- hub notebook trial

flags="--isolation chroot --layers --force-rm --network host"
[ -z "${PYTHON_IMAGE:-}" ] || flags="$flags --build-arg PYTHON_IMAGE=$PYTHON_IMAGE"
[ -z "${CA_BUNDLE:-}" ] || flags="$flags --volume $CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"

cd "$repo"
for name in "$@"; do
    [ -f "images/$name/Dockerfile" ] || { echo "build.sh: no image '$name' (hub, notebook, trial)" >&2; exit 2; }
    base=""  # the hub image has no TensorFlow base
    [ "$name" = hub ] || [ -z "${TF_IMAGE:-}" ] || base="--build-arg TF_IMAGE=$TF_IMAGE"
    echo "== $registry/$name:$tag"
    # shellcheck disable=SC2086  # flags are word lists
    buildah bud $flags $base ${BUILDAH_BUD_FLAGS:-} -f "images/$name/Dockerfile" -t "$registry/$name:$tag" .
done
