#!/usr/bin/env bash
# Host set-up for pytest-agentcgroup: system packages, kernel-header links,
# tracefs, the project venv and bcc inside it.
#
# Usage: hostsetup.sh [GROUP...]     (or AGENTCGROUP_GROUPS="core docker")
# Groups are space- or comma-separated; the default is "core docker browser".
#
# Idempotent and silent when everything is already in place.  Missing system
# pieces are reported in one line each and skipped when we cannot install them
# (not root, no apt): the tests that need them skip with a reason.  Only the
# venv is required; failing to create it (or an apt failure as root) exits 1.
set -u

# ---- package groups: add a group with one line ------------------------------
# Debian's architecture name (amd64, arm64, ...): the kernel-header packages and directories carry it.
ARCH=$(dpkg --print-architecture 2>/dev/null) || ARCH=
declare -A GROUPS_PKGS=(
  [core]="bubblewrap bpftool python3-bpfcc ${ARCH:+linux-headers-$ARCH} cgroup-tools stress-ng hyperfine"
  [docker]="docker.io debootstrap"
  [browser]="chromium fonts-liberation"
)

ROOT=${AGENTCGROUP_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
VENV=${AGENTCGROUP_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
SYS_BCC=/usr/lib/python3/dist-packages/bcc
TRACEFS=/sys/kernel/tracing

say()  { printf 'hostsetup: %s\n' "$*"; }
die()  { printf 'hostsetup: ERROR: %s\n' "$*" >&2; exit 1; }
is_root() { [ "$(id -u)" -eq 0 ]; }

cd "$ROOT" || die "cannot cd to $ROOT"
[ -f pyproject.toml ] || die "$ROOT has no pyproject.toml (set AGENTCGROUP_ROOT)"

# ---- system packages -------------------------------------------------------
# whatever the groups: the venv is required, and `python3 -m venv` needs ensurepip, which Debian
# ships separately
wanted=(python3-venv)
for g in ${*:-${AGENTCGROUP_GROUPS:-core docker browser}}; do
  for g2 in ${g//,/ }; do
    [ -n "${GROUPS_PKGS[$g2]+x}" ] || die "unknown package group '$g2' (known: ${!GROUPS_PKGS[*]})"
    wanted+=(${GROUPS_PKGS[$g2]})
  done
done

installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${wanted[@]}" 2>/dev/null \
            | awk '$NF == "installed" {print $1}')
missing=()
for p in "${wanted[@]}"; do
  grep -qxF "$p" <<<"$installed" || missing+=("$p")
done

apt_install() {  # apt_install PKG... ; output kept in $apt_log
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >>"$apt_log" 2>&1
}

if [ ${#missing[@]} -gt 0 ]; then
  if ! is_root || ! command -v apt-get >/dev/null 2>&1; then
    say "missing system packages (need root + apt-get to install; dependent tests will skip): ${missing[*]}"
  else
    say "installing: ${missing[*]}"
    apt_log=$(mktemp /tmp/hostsetup-apt.XXXXXX)
    # A failing third-party source must not stop us; install decides success.
    apt-get update -q >>"$apt_log" 2>&1 || true
    if ! apt_install "${missing[@]}"; then
      for p in "${missing[@]}"; do       # find out which package(s) failed
        if ! apt_install "$p"; then
          tail -n 15 "$apt_log" >&2
          die "apt-get could not install package '$p' (full log: $apt_log)"
        fi
      done
    fi
    # docker.io's postinst starts the system's docker.service (on systemd: its cgroup driver, its
    # containers under system.slice), and a running engine is the one sessions use, but the docker
    # executor needs a dockerd started from the session (cgroups/container.py). A docker.io we have
    # just installed is there for us: keep its service from running (`systemctl enable --now
    # docker` undoes it).
    if [[ " ${missing[*]} " == *" docker.io "* ]] && [ -d /run/systemd/system ] &&
       systemctl disable --now docker.service docker.socket >>"$apt_log" 2>&1; then
      say "stopped and disabled the docker.service that installing docker.io started (sessions start their own dockerd)"
    fi
    rm -f "$apt_log"
  fi
fi

# ---- /lib/modules/$(uname -r)/{build,source} -> Debian headers -----------------
# A stock Debian kernel's own headers when installed; else (a custom kernel) the newest installed
# Debian ones of this architecture's plain flavour (not -cloud-/-rt-): bcc only needs *some* headers
# for our tracepoint/cgroup programs, which read no kernel structs.
moddir=/lib/modules/$(uname -r)
if [ ! -e "$moddir/build" ] || [ ! -e "$moddir/source" ]; then
  hdr=
  if [ -d "/usr/src/linux-headers-$(uname -r)" ]; then
    hdr=/usr/src/linux-headers-$(uname -r)
  elif [ -n "$ARCH" ]; then
    hdr=$(ls -d /usr/src/linux-headers-*[0-9]-"$ARCH" 2>/dev/null | sort -V | tail -n 1)
  fi
  # Debian's flavour headers name their common half in their Makefile ("include .../Makefile")
  common=$(sed -n 's|^include \(/.*-common\)/Makefile$|\1|p' "$hdr/Makefile" 2>/dev/null | head -n 1)
  [ -n "$common" ] || common=${hdr%-"$ARCH"}-common
  if [ -z "$hdr" ]; then
    : # no headers installed: already reported as a missing package above
  elif [ ! -d "$common" ]; then
    say "kernel headers $hdr have no $common beside them (bcc tests will skip)"
  elif ! is_root; then
    say "missing $moddir/build and source links to $hdr (need root; bcc tests will skip)"
  else
    mkdir -p "$moddir" &&
    { [ -e "$moddir/build" ]  || ln -sfn "$hdr"    "$moddir/build"; } &&
    { [ -e "$moddir/source" ] || ln -sfn "$common" "$moddir/source"; } ||
      say "could not create header links in $moddir (bcc tests will skip)"
  fi
fi

# ---- tracefs ---------------------------------------------------------------
if ! awk -v d="$TRACEFS" '$2 == d && $3 == "tracefs" {f = 1} END {exit !f}' /proc/mounts; then
  if is_root && mount -t tracefs tracefs "$TRACEFS" 2>/dev/null; then :; else
    say "tracefs is not mounted at $TRACEFS and mounting failed (tracepoint tests will skip)"
  fi
fi

# ---- venv (required) -------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv $VENV with $PYTHON"
  "$PYTHON" -m venv --clear "$VENV" || die "could not create venv $VENV with $PYTHON"
fi
stamp=$VENV/.hostsetup-pip-stamp
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "pip install -e '.[test]' into $VENV"
  pip_log=$(mktemp /tmp/hostsetup-pip.XXXXXX)
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' >"$pip_log" 2>&1; then
    tail -n 20 "$pip_log" >&2
    die "pip install -e '.[test]' failed (full log: $pip_log)"
  fi
  rm -f "$pip_log"
  touch "$stamp"
fi

# ---- bcc into the venv: only bcc, not all of dist-packages -----------------
if [ -d "$SYS_BCC" ]; then
  sp=$(ls -d "$VENV"/lib/python3*/site-packages 2>/dev/null | head -n 1)
  [ -n "$sp" ] || die "no site-packages in $VENV"
  bccdir=$VENV/system-bcc
  if [ ! -e "$bccdir/bcc" ]; then
    mkdir -p "$bccdir" && ln -sfn "$SYS_BCC" "$bccdir/bcc" || die "could not link bcc into $bccdir"
  fi
  if [ "$(cat "$sp/system-bcc.pth" 2>/dev/null)" != "$bccdir" ]; then
    printf '%s\n' "$bccdir" >"$sp/system-bcc.pth" || die "could not write $sp/system-bcc.pth"
  fi
fi
exit 0
