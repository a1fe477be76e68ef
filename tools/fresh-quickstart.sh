#!/usr/bin/env bash
# Times `./dev quickstart` as a new user meets it: on a fresh Debian 12 system with nothing of
# Gyre's installed (no packages, no torch, no ccache), from a clean clone of this repository.
#
#   tools/fresh-quickstart.sh DIR [--keep]
#
# debootstrap installs a minimal Debian 12 (bookworm) into DIR (not timed: the user's machine
# already runs Debian), the repository's committed HEAD is cloned into it, and `./dev quickstart`
# runs inside a chroot as root, printing the time of each phase (packages, torch wheel, the rest
# of the Python packages, configure, build, job) and the total. The chroot gets /proc, /sys and
# /dev from the host and its network; services that packages would start are not started
# (policy-rc.d), which a real machine would start in the background. A host whose HTTPS goes
# through an intercepting proxy with its own certificate authority (pip's PIP_CERT set) lends the
# chroot its CA bundle, so that pip can reach PyPI; nothing else of the host's Python or pip
# setup (no wheel cache) is passed. Needs root and debootstrap (Debian package `debootstrap`).
# DIR is removed afterwards unless --keep.
set -euo pipefail

if [[ $# -lt 1 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  [[ $# -ge 1 ]] && exit 0 || exit 2
fi
ROOT="$(realpath -m "$1")"
KEEP=0
[[ "${2:-}" == --keep ]] && KEEP=1
[[ $(id -u) -eq 0 ]] || { echo "fresh-quickstart: needs root (debootstrap, chroot)" >&2; exit 2; }
command -v debootstrap >/dev/null || {
  echo "fresh-quickstart: debootstrap is missing (apt-get install debootstrap)" >&2
  exit 2
}
[[ -e "${ROOT}" ]] && { echo "fresh-quickstart: ${ROOT} exists; give a new directory" >&2; exit 2; }
REPO="$(cd "$(dirname "$0")/.." && pwd)"

cleanup() {
  for m in dev/pts dev sys proc; do
    mountpoint -q "${ROOT}/${m}" && umount -l "${ROOT}/${m}"
  done
  if ((KEEP == 0)); then rm -rf "${ROOT}"; fi
}
trap cleanup EXIT

echo "[fresh] debootstrap bookworm into ${ROOT} (not timed)" >&2
debootstrap --variant=minbase bookworm "${ROOT}" http://deb.debian.org/debian >/dev/null
cp /etc/resolv.conf "${ROOT}/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"${ROOT}/usr/sbin/policy-rc.d"
chmod +x "${ROOT}/usr/sbin/policy-rc.d"
mount -t proc proc "${ROOT}/proc"
mount --rbind /sys "${ROOT}/sys"
mount --rbind /dev "${ROOT}/dev"
# A clean clone of the committed tree, as `git clone` gives a user.
git clone -q "${REPO}" "${ROOT}/root/gyre"

ca_env=()
if [[ -n "${PIP_CERT:-}" && -f "${PIP_CERT}" ]]; then
  cp "${PIP_CERT}" "${ROOT}/root/host-ca.crt"
  ca_env=(PIP_CERT=/root/host-ca.crt SSL_CERT_FILE=/root/host-ca.crt
          REQUESTS_CA_BUNDLE=/root/host-ca.crt)
fi

echo "[fresh] ./dev quickstart in the chroot (timed)" >&2
t0=$(date +%s)
chroot "${ROOT}" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "${ca_env[@]}" \
  /bin/bash -c 'apt-get update -qq && cd /root/gyre && ./dev quickstart --quiet'
echo "[fresh] ./dev quickstart from a fresh Debian 12: $(($(date +%s) - t0)) s end to end" >&2
