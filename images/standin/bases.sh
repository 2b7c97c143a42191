#!/bin/sh
# TEST DEVICE ONLY: builds the two stand-in base images the test suite builds tunehub's images
# on, because this machine cannot pull python:3.12.8-slim-bookworm or tensorflow/tensorflow:
# 2.21.0-gpu. A Debian bookworm from debootstrap (the apt mirror this machine already reaches),
# shaped by python.Dockerfile / tensorflow.Dockerfile to look like those two images.
#
#   images/standin/bases.sh CACHE_DIR
#
# CACHE_DIR keeps the rootfs tarball between runs (debootstrap runs once). The images are tagged
#   localhost/tunehub-standin/python:bookworm       (build arg PYTHON_IMAGE)
#   localhost/tunehub-standin/tensorflow:2.21.0     (build arg TF_IMAGE)
# in buildah's storage (CONTAINERS_STORAGE_CONF picks it). Extra `buildah bud` flags (e.g. the
# CA bundle volume) come from BUILDAH_BUD_FLAGS. Needs root, debootstrap and buildah.
set -eu
cache=${1:?usage: bases.sh CACHE_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
context=$cache/standin-context
tarball=$context/bookworm-rootfs.tar
mkdir -p "$context"

if [ ! -s "$tarball" ]; then
    rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
    # python3-venv: the python stand-in's venv; python3-pip: pip in the TensorFlow stand-in.
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 \
        || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    tar --numeric-owner --xattrs -C "$rootfs" \
        --exclude=./dev/* --exclude=./proc/* --exclude=./sys/* -cf "$tarball.part" .
    mv "$tarball.part" "$tarball"
    rm -rf --one-file-system "$rootfs"
fi

# shellcheck disable=SC2086  # BUILDAH_BUD_FLAGS is a list of flags
buildah bud --isolation chroot --layers --force-rm --network host ${BUILDAH_BUD_FLAGS:-} \
    -f "$here/python.Dockerfile" -t localhost/tunehub-standin/python:bookworm "$context"
# shellcheck disable=SC2086
buildah bud --isolation chroot --layers --force-rm --network host ${BUILDAH_BUD_FLAGS:-} \
    -f "$here/tensorflow.Dockerfile" -t localhost/tunehub-standin/tensorflow:2.21.0 "$context"
