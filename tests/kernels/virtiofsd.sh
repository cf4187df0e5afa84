#!/bin/sh
# `virtiofsd` as vng (virtme-ng) calls it, served by qemu 7.2's C daemon (Debian 12's
# qemu-system-common: /usr/lib/qemu/virtiofsd). vng speaks the Rust daemon's options and falls back
# to 9p when the C one refuses them; under software emulation 9p without a cache costs a host round
# trip per lookup and read.
# vmharness.py (root_share) puts a link to this first on vng's PATH, named `virtiofsd`, wherever
# qemu ships the C daemon.
#
# vng: `virtiofsd --syslog --no-announce-submounts [--readonly] --socket-path S --shared-dir D
# --sandbox none --cache C &`, then it waits ~3 s for S.pid and SIGTERMs that pid when it ends.
# The C daemon has no read-only mode, so a read-only export is a read-only recursive bind of D in
# a mount namespace of its own (private: the host's unmounts do not reach it while the VM runs);
# the daemon chroots into it.
PATH=/usr/sbin:/usr/bin:/sbin:/bin     # runs as root: only the system's programs
export PATH
set -u
case "${1:-}" in
    --version) echo "virtiofsd (tests/kernels/virtiofsd.sh over qemu's C daemon)"; exit 0;;
    --help) echo "--readonly --socket-path --shared-dir --cache (tests/kernels/virtiofsd.sh)"; exit 0;;
esac
daemon=/usr/lib/qemu/virtiofsd
sock= dir= cache=auto readonly=
while [ $# -gt 0 ]; do
    case "$1" in
        --socket-path) sock=$2; shift;;
        --shared-dir) dir=$2; shift;;
        --cache) cache=$2; shift;;
        --readonly) readonly=1;;
        --sandbox) shift;;
    esac
    shift
done
say() { echo "virtiofsd.sh: $*" >&2; }
[ -n "$sock" ] && [ -n "$dir" ] || { say "no --socket-path or --shared-dir"; exit 2; }
[ -x "$daemon" ] || { say "$daemon is missing (Debian's qemu-system-common)"; exit 2; }
rm -f "$sock"           # vng made it with mkstemp; the daemon makes the socket
if [ -z "$readonly" ]; then
    "$daemon" --socket-path="$sock" -o source="$dir",cache="$cache",sandbox=chroot 2>/dev/null &
    pid=$!
    root=
else
    root=$(mktemp -d "${TMPDIR:-/tmp}/agentcgroup-virtiofs.XXXXXX") || exit 2
    # In the namespace: the tree bound at $root, every mount of it remounted read-only (mount
    # cannot do that recursively), then the daemon in place of the shell (the pid vng is given).
    # /proc/self/mountinfo's field 5 is the mount point, with \040-style escapes.
    unshare --mount --propagation private sh -c '
        root=$1 daemon=$2 sock=$3 cache=$4
        mount --rbind "$5" "$root" || exit 2
        awk "{ print \$5 }" /proc/self/mountinfo | while read -r point; do
            point=$(printf "%b" "$point")
            case "$point" in "$root"|"$root"/*) mount -o remount,bind,ro "$point" || exit 2;; esac
        done || exit 2
        exec "$daemon" --socket-path="$sock" -o source="$root",cache="$cache",sandbox=chroot 2>/dev/null
    ' sh "$root" "$daemon" "$sock" "$cache" "$dir" &
    pid=$!
fi
# within vng's wait (0.1 + 0.2 + 0.4 + 0.8 + 1.6 s): later, it has taken 9p and never connects
i=0
while [ ! -S "$sock" ] && [ $i -lt 50 ] && kill -0 $pid 2>/dev/null; do sleep 0.05; i=$((i + 1)); done
if [ -S "$sock" ]; then
    echo $pid >"$sock.pid"           # vng waits for it, and signals that pid when it ends
else
    say "$daemon did not make $sock within 2.5 s (vng falls back to 9p)"
    kill $pid 2>/dev/null
fi
wait $pid
rc=$?
rm -f "$sock.pid"                    # the pid is gone: vng must not signal whoever gets it next
[ -z "$root" ] || rmdir "$root"
exit $rc
