#!/usr/bin/env bash
# Host set-up for pytest-agentcgroup: system packages, kernel-header links,
# tracefs, the project venv and bcc inside it.
#
# Usage: hostsetup.sh [GROUP...]     (or AGENTCGROUP_GROUPS="core docker")
# Groups are space- or comma-separated; the default is "core docker browser".
# Groups `vm` and `vm-kernels` also install Debian kernels for the pure cgroup v2 VM tests
# (tests/kernels/): see "kernels for the VM" below.
#
# Idempotent and silent when everything is already in place.  Missing system
# pieces are reported in one line each and skipped when we cannot install them
# (not root, no apt): the tests that need them skip with a reason.  Only the
# venv is required; failing to create it (or an apt failure as root) exits 1.
set -u

# ---- package groups: from programs.tsv -------------------------------------
# Debian's architecture name (amd64, arm64, ...): the kernel-header packages and directories carry it.
ARCH=$(dpkg --print-architecture 2>/dev/null) || ARCH=
# The VM tests (tests/kernels/) boot a Debian kernel of the host's own architecture, of this
# package flavour (linux-image-<release>-<flavour>); programs.tsv names the qemu that emulates it.
# Elsewhere no kernel is fetched and those tests skip saying so (tests/kernels/vmharness.py).
case "$ARCH" in
  amd64)   KFLAVOUR=amd64 ;;
  arm64)   KFLAVOUR=arm64 ;;
  ppc64el) KFLAVOUR=powerpc64le ;;
  riscv64) KFLAVOUR=riscv64 ;;
  *)       KFLAVOUR= ;;
esac
# programs.tsv (beside this script) is the one list of the programs the project starts and the
# packages that provide them, plus the packages that provide no program (headers, fonts...): each
# row's package goes into each of its groups. Read with bash builtins only: on a bare Debian there
# is nothing else yet. Groups base (in every Debian) and setup (python3 for the venv) are always
# installed; systemd is never (there when systemd is the init); pip:* rows are pip's (the venv).
TABLE=$(dirname "$0")/programs.tsv
[ -f "$TABLE" ] || TABLE=${AGENTCGROUP_ROOT:-.}/pytest_agentcgroup/programs.tsv    # a copy of this script
declare -A GROUPS_PKGS=()
while IFS=$'\t' read -r prog pkg groups arch _; do
  case "$prog" in ''|'#'*) continue ;; esac
  [ "$arch" = '*' ] || [ "$arch" = "$ARCH" ] || continue
  case "$pkg" in
    pip:*) continue ;;
    *'{arch}'*) [ -n "$ARCH" ] || continue; pkg=${pkg//'{arch}'/$ARCH} ;;
  esac
  for g in ${groups//,/ }; do
    [ "$g" = systemd ] || [[ " ${GROUPS_PKGS[$g]:-} " == *" $pkg "* ]] || GROUPS_PKGS[$g]+=" $pkg"
  done
done <"$TABLE" || { printf 'hostsetup: ERROR: cannot read %s\n' "$TABLE" >&2; exit 1; }
# kernel series each group boots in tests/kernels/ (newest patch release of each, chosen by apt)
declare -A GROUPS_KERNELS=(
  [vm]="6.12"
  [vm-kernels]="6.1 6.12 7.3"
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
# whatever the groups: base and setup (python3 and python3-venv: the venv is required, and
# `python3 -m venv` needs ensurepip, which Debian ships separately), installed before the venv
# step below uses them
kernels=()
wanted=()
for g in base setup ${*:-${AGENTCGROUP_GROUPS:-core docker browser}}; do
  for g2 in ${g//,/ }; do
    [ -n "${GROUPS_PKGS[$g2]+x}" ] || die "unknown package group '$g2' (known: ${!GROUPS_PKGS[*]})"
    wanted+=(${GROUPS_PKGS[$g2]})
    kernels+=(${GROUPS_KERNELS[$g2]:-})
  done
done

installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${wanted[@]}" 2>/dev/null \
            | awk '$NF == "installed" {print $1}')
missing=()
for p in "${wanted[@]}"; do
  grep -qxF "$p" <<<"$installed" || [[ " ${missing[*]} " == *" $p "* ]] || missing+=("$p")
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

# ---- kernels for the VM (groups vm, vm-kernels) -----------------------------
# tests/kernels/ boots these under qemu with only cgroup2 mounted. A series (6.12) is the newest
# `linux-image-<series>…-<flavour>` apt offers: from the host's own sources (bookworm: 6.1, 6.12 in
# bookworm-security), else from a private apt state on trixie + trixie-backports + trixie-security
# (7.3, the only Debian kernel with sched_ext). Never installed as a host package (that would add
# it to the boot loader and could change the host's default kernel): the image and headers are
# downloaded (`apt-get download`) and unpacked (`dpkg-deb -x`) under $KERNELS_DIR/<release>, and
# the VM boots the vmlinuz there. A series already unpacked is kept (no apt query, no network);
# kernels installed on the host by earlier versions of this script are left as they are.
# Each is recorded in $KERNELS_INDEX as "<series> <release> <vmlinuz>", which the tests read. The
# host's /lib/modules is left alone (a link there would be followed by dpkg if the host ever
# installed that release): the unpacked tree's own lib/modules/<release> gets build and source
# links to the tree's headers (bcc in the guest compiles against them) and its modules.dep, and the
# guest mounts it at /lib/modules/<release> (vng does, and tests/kernels/vmharness.py makes sure).
# Links an earlier version of this script made in /lib/modules into $KERNELS_DIR are removed. Not
# under /var/cache: vng hides /var/cache (and /var/tmp, /var/log) behind a tmpfs in the guest.
KERNELS_DIR=${AGENTCGROUP_KERNELS_DIR:-/var/lib/agentcgroup/kernels}
KERNELS_INDEX=$KERNELS_DIR/index

kernel_regex() {  # linux-image package names of a series, e.g. 6.1 -> 6.1.0-56-amd64, not 6.12
  printf '^linux-image-%s[.-][0-9.]*(-[0-9]+)?(\\+deb[0-9]+)?-%s$' "${1//./\\.}" "$KFLAVOUR"
}

host_apt_updated=
host_apt_update() {
  [ -n "$host_apt_updated" ] && return 0
  apt-get update -q >>"$apt_log" 2>&1 || true    # a failing third-party source must not stop us
  host_apt_updated=1
}

index_kernel() {  # index_kernel SERIES RELEASE VMLINUZ
  local tmp
  mkdir -p "$KERNELS_DIR" || return 1
  tmp=$(mktemp "$KERNELS_INDEX.XXXXXX") || return 1
  { grep -v "^$1 " "$KERNELS_INDEX" 2>/dev/null; printf '%s %s %s\n' "$1" "$2" "$3"; } >"$tmp" &&
    mv -f "$tmp" "$KERNELS_INDEX"
}

uri_suites() {  # "<URI> <suite>" for each deb source the host's apt uses (one-line and deb822 files)
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] && awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
                                      print $i, $(i + 1) }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && awk 'function flush() { if (deb) for (i = 1; i <= n; i++) print uri, su[i]; deb = 0; n = 0 }
      /^[ \t]*$/ { flush(); next }
      $1 == "Types:" { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
      $1 == "URIs:" { uri = $2 }
      $1 == "Suites:" { n = 0; for (i = 2; i <= NF; i++) su[++n] = $i }
      END { flush() }' "$f"
  done
}

debian_mirrors() {  # "<archive URI> <security URI>": the Debian mirrors the host's own sources name
  uri_suites | awk '$2 ~ /-security$/ { if (sec == "") sec = $1; next }
                    $2 ~ /^[a-z]+$/ && $1 ~ /\/debian\/?$/ { if (arc == "") arc = $1 }
                    END { print arc, sec }'
}

trixie_opts=()
trixie_apt() {  # a private apt state on trixie + backports + security, updated once; sets trixie_opts
  [ ${#trixie_opts[@]} -gt 0 ] && return 0
  local arc sec state
  read -r arc sec < <(debian_mirrors)
  [ -n "$arc" ] || die "kernel $1: no Debian archive in /etc/apt/sources.list{,.d} to fetch trixie from"
  state=$KERNELS_DIR/apt-trixie
  mkdir -p "$state/lists/partial" "$state/cache/archives/partial" || die "cannot create $state"
  { printf 'deb %s trixie main\ndeb %s trixie-backports main\n' "$arc" "$arc"
    [ -z "$sec" ] || printf 'deb %s trixie-security main\n' "$sec"; } >"$state/sources.list"
  trixie_opts=(-o "Dir::Etc::sourcelist=$state/sources.list" -o Dir::Etc::sourceparts=/dev/null
               -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache")
  apt-get "${trixie_opts[@]}" update -q >>"$apt_log" 2>&1 ||
    { tail -n 15 "$apt_log" >&2; die "kernel $1: apt-get update of trixie from $arc failed (full log: $apt_log)"; }
}

kernel_fetch() {  # SERIES: apt-get download + dpkg-deb -x into $KERNELS_DIR/<release>
  local re rel dir found pkg pkgs opts=() from="the host's apt sources"
  re=$(kernel_regex "$1")
  found=$(ls -d "$KERNELS_DIR"/*/usr/lib/modules/*/vmlinuz "$KERNELS_DIR"/*/boot/vmlinuz-* 2>/dev/null |
          sed "s|^$KERNELS_DIR/||; s|/.*||; s/^/linux-image-/" | grep -E "$re" | sort -V | tail -n 1)
  if [ -n "$found" ]; then
    rel=${found#linux-image-}
  else
    host_apt_update
    pkg=$(apt-cache pkgnames linux-image- 2>/dev/null | grep -E "$re" | sort -V | tail -n 1)
    if [ -z "$pkg" ]; then
      trixie_apt "$1"
      opts=("${trixie_opts[@]}") from="trixie"
      pkg=$(apt-cache "${opts[@]}" pkgnames linux-image- 2>/dev/null | grep -E "$re" | sort -V | tail -n 1)
      [ -n "$pkg" ] || die "kernel $1: no package matching $re in the host's sources, trixie, trixie-backports or trixie-security"
    fi
    rel=${pkg#linux-image-}
    say "fetching kernel $1 for the VM tests: $rel (from $from, unpacked into $KERNELS_DIR/$rel, not installed)"
    dir=$KERNELS_DIR/$rel
    rm -rf "$dir.part" && mkdir -p "$dir.part/debs" || die "cannot create $dir.part"
    # the image and headers with their own parts (trixie: linux-binary-*, linux-modules-*,
    # linux-headers-*-common, linux-kbuild-*), i.e. their dependencies named for this release
    pkgs=("linux-image-$rel" "linux-headers-$rel")
    pkgs+=($(apt-cache "${opts[@]}" depends "${pkgs[@]}" 2>/dev/null |
             awk -v r="${rel%-"$KFLAVOUR"}" '$1 == "Depends:" && index($2, r) {print $2}' | sort -u))
    ( cd "$dir.part/debs" && apt-get "${opts[@]}" download -q "${pkgs[@]}" ) >>"$apt_log" 2>&1 ||
      { tail -n 15 "$apt_log" >&2; die "kernel $1: apt-get download of $rel failed (full log: $apt_log)"; }
    for pkg in "$dir.part"/debs/*.deb; do
      dpkg-deb -x "$pkg" "$dir.part" || die "kernel $1: dpkg-deb -x $pkg failed"
    done
    rm -rf "$dir.part/debs" && mv "$dir.part" "$dir" || die "cannot move $dir.part to $dir"
  fi
  dir=$KERNELS_DIR/$rel
  local mods=$dir/usr/lib/modules/$rel
  [ -d "$mods" ] || mods=$dir/lib/modules/$rel
  [ -d "$mods" ] || die "kernel $1: $dir holds no lib/modules/$rel"
  # the tree's own headers (absolute links: the guest sees the host's paths), not the host's
  # /usr/src, which a deb's own build link names and a host without that headers package lacks
  local hdr=$dir/usr/src/linux-headers-$rel common=$dir/usr/src/linux-headers-${rel%-"$KFLAVOUR"}-common
  [ -d "$hdr" ] && [ -d "$common" ] || die "kernel $1: $dir holds no headers (usr/src/linux-headers-$rel and its -common)"
  [ "$(readlink "$mods/build")" = "$hdr" ]     || ln -sfn "$hdr" "$mods/build" || die "cannot link $mods/build"
  [ "$(readlink "$mods/source")" = "$common" ] || ln -sfn "$common" "$mods/source" || die "cannot link $mods/source"
  [ -s "$mods/modules.dep" ] || depmod -b "${mods%/lib/modules/"$rel"}" "$rel" || die "kernel $1: depmod -b for $mods failed"
  local vmlinuz=$dir/usr/lib/modules/$rel/vmlinuz    # trixie keeps it with the modules, older releases in /boot
  [ -f "$vmlinuz" ] || vmlinuz=$dir/boot/vmlinuz-$rel
  [ -f "$vmlinuz" ] || die "kernel $1: $dir holds no vmlinuz"
  index_kernel "$1" "$rel" "$vmlinuz"
}

# Earlier versions linked /lib/modules/<release> to the unpacked trees, and build/source inside
# the host's own /lib/modules/<release> (apt's directories) to their headers: remove exactly the
# links whose target as written is in $KERNELS_DIR (apt's build/source name /usr/src). build and
# source under a <release> that is itself such a link are the tree's own, never touched.
HOST_MODULES=/lib/modules
ours=()
for link in "$HOST_MODULES"/* "$HOST_MODULES"/*/build "$HOST_MODULES"/*/source; do
  [ -L "$link" ] || continue
  case "$link" in */build|*/source) [ -L "${link%/*}" ] && continue ;; esac
  case "$(readlink "$link")" in "$KERNELS_DIR"/*) ours+=("$link") ;; esac
done
if [ ${#ours[@]} -gt 0 ] && ! is_root; then
  say "links into $KERNELS_DIR an earlier set-up made in $HOST_MODULES are left (removing them needs root): ${ours[*]}"
else
  for link in "${ours[@]}"; do
    if rm -f "$link"; then
      say "removed $link (a link into $KERNELS_DIR; the VM mounts its modules itself)"
    else
      say "cannot remove $link (a link into $KERNELS_DIR an earlier set-up made)"
    fi
  done
fi

if [ ${#kernels[@]} -gt 0 ]; then
  if [ -z "$KFLAVOUR" ]; then
    say "kernels for the VM tests not fetched: no Debian kernel flavour known for architecture '${ARCH:-unknown}' (those tests will skip)"
  elif ! is_root || ! command -v apt-get >/dev/null 2>&1; then
    say "kernels for the VM tests not fetched (need root + apt-get; those tests will skip): ${kernels[*]}"
  else
    apt_log=$(mktemp /tmp/hostsetup-apt.XXXXXX)
    for series in $(printf '%s\n' "${kernels[@]}" | sort -u); do
      kernel_fetch "$series"
    done
    rm -f "$apt_log"
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
