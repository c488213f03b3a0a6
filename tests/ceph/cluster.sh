#!/usr/bin/env bash
# A throw-away one-node Ceph cluster for tests: one monitor, one OSD on
# memstore (RAM only), one radosgw; cephx off, everything on loopback, all
# state under DIR. From Debian's packages (ceph-mon, ceph-osd, radosgw,
# ceph-common; `.ci/setup.sh` installs them).
#
#   cluster.sh start DIR MON_PORT RGW_PORT OWNER_PID
#       starts the cluster, prints `endpoint http://127.0.0.1:RGW_PORT` when
#       radosgw answers, then returns; a watcher left behind stops the
#       cluster and deletes DIR when OWNER_PID exits (a test binary that
#       dies leaves nothing running).
#   cluster.sh user DIR UID ACCESS_KEY SECRET_KEY
#       creates an S3 user with these keys.
#   cluster.sh stop DIR
set -euo pipefail

# A start that fails stops what it started (the logs stay for the message).
STARTING=""
die() {
  echo "ceph cluster: $*" >&2
  if [ -n "$STARTING" ]; then
    kill_daemons "$STARTING"
  fi
  exit 1
}

kill_daemons() {
  local f
  for f in "$1"/run/*.pid; do
    if [ -e "$f" ]; then
      kill -9 "$(cat "$f")" 2>/dev/null || true
    fi
  done
}

stop() {
  kill_daemons "$1"
  rm -rf "$1"
}

start() {
  local dir=$1 mon_port=$2 rgw_port=$3 owner=$4
  for bin in ceph-mon ceph-osd radosgw radosgw-admin ceph monmaptool; do
    command -v "$bin" >/dev/null || die "$bin is missing: run \`bash .ci/setup.sh\` (it installs Debian's ceph-mon, ceph-osd, radosgw and ceph-common)"
  done
  mkdir -p "$dir"/{mon,osd,run,log,rgw}
  STARTING=$dir
  local fsid conf=$dir/ceph.conf
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat > "$conf" <<CONF
[global]
fsid = $fsid
mon host = v1:127.0.0.1:$mon_port
ms bind msgr2 = false
public addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
run dir = $dir/run
log file = $dir/log/\$name.log
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
crash dir = $dir/crash
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
osd pool default pg autoscale mode = off
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
mon warn on pool no redundancy = false
# A nearly full disk in CI must not stop the monitor (memstore keeps the
# data in RAM anyway).
mon data avail crit = 0
mon data avail warn = 0
osd objectstore = memstore
memstore device bytes = 8589934592
osd crush chooseleaf type = 0
# The OSD is put in the CRUSH map below, before it starts: at boot, Ceph 16
# sometimes sends these updates before it has the cluster's fsid, and the
# monitor refuses them ("wrong fsid"), which stops the OSD.
osd crush update on start = false
osd class update on start = false
osd op num threads per shard = 1
osd op num shards = 2
[mon.a]
mon data = $dir/mon
[osd.0]
osd data = $dir/osd
[client.rgw]
rgw frontends = beast endpoint=127.0.0.1:$rgw_port
rgw data = $dir/rgw
rgw dns name = localhost
rgw enable usage log = true
CONF
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >/dev/null 2>&1 || die "ceph-mon --mkfs failed (see $dir/log)"
  ceph-mon -c "$conf" -i a || die "ceph-mon did not start (see $dir/log/mon.a.log)"
  # A fresh client's first command can reach the monitor before the client
  # knows the cluster's fsid; the monitor refuses it ("handle_command on
  # fsid 0000... != ..."), nothing is changed, and the same command again
  # succeeds. So both commands are retried (a refused `osd create`
  # allocates nothing; adding the same CRUSH item again is harmless).
  local id tries=0
  until id=$(ceph -c "$conf" --connect-timeout 30 osd create 2>/dev/null); do
    tries=$((tries + 1))
    [ "$tries" -lt 5 ] || die "the monitor does not answer (see $dir/log/mon.a.log)"
    sleep 1
  done
  [ "$id" = 0 ] || die "unexpected OSD id $id"
  tries=0
  until ceph -c "$conf" --connect-timeout 30 osd crush add osd.0 1.0 root=default host=localhost >/dev/null 2>&1; do
    tries=$((tries + 1))
    [ "$tries" -lt 5 ] || die "placing the OSD in the CRUSH map failed (see $dir/log/mon.a.log)"
    sleep 1
  done
  ceph-osd -c "$conf" -i 0 --mkfs >/dev/null 2>&1 || die "ceph-osd --mkfs failed (see $dir/log/osd.0.log)"
  ceph-osd -c "$conf" -i 0 >/dev/null 2>&1 || die "ceph-osd did not start (see $dir/log/osd.0.log)"
  radosgw -c "$conf" -n client.rgw || die "radosgw did not start (see $dir/log/client.rgw.log)"
  local deadline=$((SECONDS + 180))
  until curl -sf -o /dev/null "http://127.0.0.1:$rgw_port/"; do
    [ $SECONDS -lt $deadline ] || die "radosgw did not answer within 180 s (see $dir/log)"
    sleep 0.5
  done
  # The watcher: the cluster lives as long as its owner.
  (
    exec >/dev/null 2>&1 </dev/null
    while kill -0 "$owner" 2>/dev/null && [ -d "$dir" ]; do sleep 1; done
    stop "$dir"
  ) &
  disown
  STARTING=""
  echo "endpoint http://127.0.0.1:$rgw_port"
}

user() {
  local dir=$1 uid=$2 ak=$3 sk=$4
  radosgw-admin -c "$dir/ceph.conf" -n client.admin user create --uid="$uid" --display-name="$uid" \
    --access-key="$ak" --secret-key="$sk" >/dev/null 2>"$dir/log/user-$uid.err" ||
    die "radosgw-admin user create $uid failed: $(tail -3 "$dir/log/user-$uid.err")"
}

case "${1:-}" in
  start) [ $# -eq 5 ] || die "usage: $0 start DIR MON_PORT RGW_PORT OWNER_PID"; start "$2" "$3" "$4" "$5" ;;
  user) [ $# -eq 5 ] || die "usage: $0 user DIR UID ACCESS_KEY SECRET_KEY"; user "$2" "$3" "$4" "$5" ;;
  stop) [ $# -eq 2 ] || die "usage: $0 stop DIR"; stop "$2" ;;
  *) die "usage: $0 start|user|stop ..." ;;
esac
