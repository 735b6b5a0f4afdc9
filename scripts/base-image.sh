#!/usr/bin/env bash
# The images' base without a registry: Debian bookworm (minbase) with python3 and venv,
# made by debootstrap from the Debian mirror apt already uses and imported with `docker import`.
#
#   base-image.sh TAG       build TAG (e.g. gnn-faas-base:bookworm) into the engine that
#                           DOCKER_HOST names, unless it already holds TAG
#
# The root filesystem's tarball is cached under $GNN_FAAS_IMAGES_CACHE (default
# ~/.cache/gnn-faas-images) so a second build on the same machine skips debootstrap; a missing
# or broken cache is rebuilt. No CA bundle goes into the base: pip in the builds gets the host's
# bundle as a BuildKit secret, and the Python clients in the images use certifi's.
# Needs root (debootstrap chroots) and debootstrap (scripts/docker-engine.sh installs it).
set -euo pipefail
TAG=${1:?usage: base-image.sh TAG}
DOCKER=${DOCKER:-docker}
CACHE=${GNN_FAAS_IMAGES_CACHE:-$HOME/.cache/gnn-faas-images}
SUITE=bookworm
INCLUDE=python3,python3-venv
log() { echo "base-image.sh: $*" >&2; }

if "$DOCKER" image inspect "$TAG" >/dev/null 2>&1; then
  log "$TAG present"; exit 0
fi
mkdir -p "$CACHE"
TARBALL="$CACHE/$SUITE-minbase-$(echo "$INCLUDE" | tr ',' '-').tar.gz"
if ! gzip -t "$TARBALL" 2>/dev/null; then
  mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1=="deb"{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || { log "no Debian mirror found in apt's sources"; exit 1; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/gnn-faas-base.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  log "debootstrap --variant=minbase $SUITE from $mirror (a few minutes, once per machine)"
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$work/root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }
  # Slim it: apt lists and caches, docs, man pages, locales (what -slim images drop). The
  # standard library's byte code stays: the root filesystem is read-only at run time.
  rm -rf "$work"/root/var/lib/apt/lists/* "$work"/root/var/cache/apt/*.bin \
    "$work"/root/var/cache/apt/archives/*.deb "$work"/root/usr/share/doc/* \
    "$work"/root/usr/share/man/* "$work"/root/usr/share/info/* "$work"/root/usr/share/locale/* \
    "$work"/root/var/log/*.log "$work"/root/var/cache/debconf/*-old
  # glibc's iconv modules: Python never loads them (its codecs are its own)
  rm -rf "$work"/root/usr/lib/x86_64-linux-gnu/gconv
  tar --numeric-owner -C "$work/root" -czf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
fi
log "importing $TARBALL as $TAG"
"$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
  "$TARBALL" "$TAG" >/dev/null
