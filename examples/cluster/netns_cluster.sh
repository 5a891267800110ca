#!/usr/bin/env bash
# A chunkserve cluster on one machine with a real network between its nodes: every node is a
# network namespace ("host") with its own address in 198.18.0.0/24 (RFC 2544's benchmarking
# range: it exists only inside this machine), and the links between hosts can be given latency,
# jitter and loss, or cut silently (packets dropped: no FIN, no RST) and healed. Builds nothing:
# uses BIN (default build/bin). Needs root, iproute2 (`ip`), python3 and /dev/net/tun.
#
#   netns_cluster.sh up [--workers N] [--routers N] [--policy P[,P..]] [--secret] [--tls]
#                       [--kv-mb N] [--threads N] [--router-args "..."] [--worker-args "..."]
#                       [--owner PID]
#       Creates the hosts (client, r0.., w0..), starts a router on each rK and a worker on each
#       wK (built-in tiny model; every worker registers with every router; router rK gets the
#       K-th policy of the list, default ttft, the last repeating), waits until every
#       router has every worker, prints "ready", and then stays in the foreground until Ctrl-C,
#       SIGTERM, `down`, or (with --owner) until process PID is gone. Everything it created is
#       torn down when it exits, whatever the exit path. Run it in the background (`up &`) and
#       drive the cluster with the commands below from any shell.
#   netns_cluster.sh wait [SECONDS]          until `up` printed ready (exit 1 if it died)
#   netns_cluster.sh shape HOST|all [delay D [J]] [loss P%]   netem-style link settings of the
#                                            packets HOST sends, e.g. `shape all delay 2ms 1ms`;
#                                            `shape all` alone clears them
#   netns_cluster.sh cut HOST [PEER]         silently drop all packets from and to HOST (or only
#                                            between HOST and PEER); prints when it took effect
#   netns_cluster.sh heal HOST [PEER] | all  undo a cut
#   netns_cluster.sh loadgen [--via rK] ARGS...   chunkserve-loadgen on the client host against
#                                            router rK (default r0), with the cluster's secret
#                                            and TLS settings; ARGS go to loadgen
#   netns_cluster.sh metrics HOST [REGEX]    HOST's /metrics (lines matching ^REGEX), read over
#                                            the host's loopback: works while HOST is cut off
#   netns_cluster.sh exec HOST CMD...        run CMD on HOST (inside its namespace)
#   netns_cluster.sh addr HOST | log HOST    HOST's address | the path of its process's log
#   netns_cluster.sh stats                   the switch's per-host packet counters (JSON)
#   netns_cluster.sh status                  hosts, addresses, processes, link settings
#   netns_cluster.sh down                    stop the cluster `up` started, and wait until it is
#                                            gone (namespaces deleted)
#   netns_cluster.sh clean                   remove what killed runs left behind (namespaces
#                                            named csn-PID-* whose `up` process is gone)
#
# Environment: BIN (binaries), CSN_STATE (the cluster's state directory: logs, keys, control
# files; default /tmp/chunkserve-netns; one cluster per directory, so parallel runs use their
# own). Namespaces are named csn-<pid of up>-<host>, so runs never collide.
#
# Exit status 77 from `up` means this machine cannot make the namespaces or links (not root, no
# `ip`, no /dev/net/tun, namespace creation refused): tests treat it as "skip".
#
# The network: examples/cluster/netns_switch.py (a user-space switch) holds one TUN device per
# host and forwards packets between them, applying the link settings -- the same effect as `tc
# netem` on a veth, which needs sch_netem, a kernel option that not every kernel has (the CI
# machine's has not). Management traffic (`metrics`, `exec`) never crosses those links.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
self="$here/$(basename "${BASH_SOURCE[0]}")"
BIN="${BIN:-$here/../../build/bin}"
CSN_STATE="${CSN_STATE:-/tmp/chunkserve-netns}"
NET=198.18.0
ROUTER_PORT=7000
ROUTER_HTTP=9000
WORKER_PORT=7100
WORKER_HTTP=9100

die() { echo "netns_cluster: $*" >&2; exit 1; }
skip() { echo "netns_cluster: cannot build the network here: $*" >&2; exit 77; }

# --- hosts and state ------------------------------------------------------------------------------

host_addr() {  # client -> .2, rK -> .(10+K), wK -> .(100+K)
  case "$1" in
    client) echo "$NET.2" ;;
    r[0-9]*) echo "$NET.$((10 + ${1#r}))" ;;
    w[0-9]*) echo "$NET.$((100 + ${1#w}))" ;;
    *) die "unknown host '$1' (client, rK, wK)" ;;
  esac
}
host_http() {
  case "$1" in
    r*) echo $ROUTER_HTTP ;;
    w*) echo $WORKER_HTTP ;;
    *) die "$1 serves no /metrics" ;;
  esac
}

cluster_id() {
  [[ -f "$CSN_STATE/id" ]] || die "no cluster in $CSN_STATE (run up first, or set CSN_STATE)"
  cat "$CSN_STATE/id"
}
ns_of() {  # the namespace of host $1 in the current cluster
  local id
  id="$(cluster_id)"
  grep -qx "$1" "$CSN_STATE/hosts" 2>/dev/null ||
    die "no host '$1' in this cluster ($(tr '\n' ' ' <"$CSN_STATE/hosts"))"
  echo "csn-$id-$1"
}
up_alive() {  # whether process $1 is a live netns_cluster.sh
  [[ -r "/proc/$1/cmdline" ]] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q netns_cluster
}

# --- teardown -------------------------------------------------------------------------------------

# Stops every process in the namespaces of run $1 (SIGTERM, SIGKILL after 5 s; the switch last)
# and deletes the namespaces.
teardown_group() {
  local id="$1" ns all=() hosts=() pids
  mapfile -t all < <(ip netns list 2>/dev/null | awk '{print $1}' | grep "^csn-$id-" || true)
  [[ ${#all[@]} -gt 0 ]] || return 0
  for ns in "${all[@]}"; do [[ $ns == "csn-$id-sw" ]] || hosts+=("$ns"); done
  stop_in() {
    local sig="$1"; shift
    for ns in "$@"; do
      pids="$(ip netns pids "$ns" 2>/dev/null || true)"
      # shellcheck disable=SC2086
      [[ -z $pids ]] || kill "-$sig" $pids 2>/dev/null || true
    done
  }
  any_in() {
    for ns in "$@"; do [[ -z "$(ip netns pids "$ns" 2>/dev/null || true)" ]] || return 0; done
    return 1
  }
  for group in hosts sw; do
    local set=()
    if [[ $group == hosts ]]; then set=("${hosts[@]}"); else set=("csn-$id-sw"); fi
    [[ ${#set[@]} -gt 0 ]] || continue
    ip netns list | grep -q "^csn-$id-" || break
    stop_in TERM "${set[@]}"
    for _ in $(seq 50); do any_in "${set[@]}" || break; sleep 0.1; done
    stop_in KILL "${set[@]}"
    for _ in $(seq 50); do any_in "${set[@]}" || break; sleep 0.1; done
  done
  for ns in "${all[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}

# Removes the namespaces of runs whose `up` process is gone (killed runs).
clean_leftovers() {
  local id
  for id in $(ip netns list 2>/dev/null | awk '{print $1}' |
              sed -n 's/^csn-\([0-9]\+\)-.*/\1/p' | sort -u); do
    if ! up_alive "$id"; then
      echo "netns_cluster: removing leftovers of run $id" >&2
      teardown_group "$id"
    fi
  done
}

# --- the switch -----------------------------------------------------------------------------------

# ctl COMMAND...: sends one command to the switch, waits for its acknowledgement (10 s), prints
# "COMMAND: applied at EPOCH" (wall-clock seconds) and fails on an error.
ctl() {
  local seq ack="" id
  id="$(cluster_id)"
  up_alive "$id" || die "the cluster's up process ($id) is gone"
  exec 9>"$CSN_STATE/ctl.lock"
  flock -w 30 9 || die "the switch's control lock is held"
  seq=$(($(cat "$CSN_STATE/seq" 2>/dev/null || echo 0) + 1))
  echo "$seq" >"$CSN_STATE/seq"
  timeout 10 bash -c 'printf "%s\n" "$1" >"$2"' _ "$seq $*" "$CSN_STATE/ctl" ||
    die "the switch does not read its control FIFO"
  for _ in $(seq 1000); do
    ack="$(cat "$CSN_STATE/ack" 2>/dev/null || true)"
    [[ ${ack%% *} == "$seq" ]] && break
    sleep 0.01
  done
  exec 9>&-
  [[ ${ack%% *} == "$seq" ]] || die "the switch did not acknowledge '$*'"
  read -r _ at status <<<"$ack"
  [[ $status == ok ]] || die "switch: '$*': $status"
  echo "$*: applied at $at"
}

ms_of() {  # 2ms | 1.5ms | 500us | 0.1s | 2 (ms) -> milliseconds
  local v="$1"
  case "$v" in
    *us) awk -v x="${v%us}" 'BEGIN {print x / 1000}' ;;
    *ms) echo "${v%ms}" ;;
    *s) awk -v x="${v%s}" 'BEGIN {print x * 1000}' ;;
    *) echo "$v" ;;
  esac
}
is_time() { [[ $1 =~ ^[0-9.]+(us|ms|s)?$ ]]; }

cmd_shape() {
  [[ $# -ge 1 ]] || die "usage: shape HOST|all [delay D [J]] [loss P%]"
  local target="$1" delay=0 jitter=0 loss=0
  shift
  [[ $target == all ]] || ns_of "$target" >/dev/null
  while [[ $# -gt 0 ]]; do
    case "$1" in
      delay)
        [[ $# -ge 2 ]] && is_time "$2" || die "delay needs a time (e.g. 20ms)"
        delay="$(ms_of "$2")"; shift 2
        if [[ $# -gt 0 ]] && is_time "$1"; then jitter="$(ms_of "$1")"; shift; fi ;;
      loss)
        [[ $# -ge 2 && $2 =~ ^[0-9.]+%?$ ]] || die "loss needs a percentage (e.g. 1%)"
        loss="${2%\%}"; shift 2 ;;
      *) die "shape: unknown setting '$1' (delay D [J], loss P%)" ;;
    esac
  done
  ctl shape "$target" "$delay" "$jitter" "$loss"
}

# --- keys -----------------------------------------------------------------------------------------

make_secrets() {  # the cluster secret and the client token (examples/cluster/README.md)
  mkdir -p "$CSN_STATE/keys"
  (
    umask 077
    openssl rand -hex 32 >"$CSN_STATE/keys/cluster.secret"
    openssl rand -hex 32 >"$CSN_STATE/keys/client.token"
  )
}

make_pki() {  # a cluster CA and one certificate per router and worker (examples/cluster/README.md)
  local node addr
  mkdir -p "$CSN_STATE/pki"
  (
    umask 077
    cd "$CSN_STATE/pki"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=chunkserve cluster CA" -keyout ca.key -out ca.pem \
        -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
        2>/dev/null
    for node in "$@"; do
      addr="$(host_addr "$node")"
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$node" \
          -keyout "$node.key" -out "$node.csr" 2>/dev/null
      printf '%s\n' "subjectAltName=IP:$addr,DNS:$node" "extendedKeyUsage=serverAuth,clientAuth" \
          "basicConstraints=critical,CA:FALSE" >"$node.ext"
      openssl x509 -req -in "$node.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
          -extfile "$node.ext" -out "$node.pem" 2>/dev/null
    done
    # The CA's revocation list (nothing revoked yet), so that every link runs the CRL check.
    touch index.txt
    echo 1000 >crlnumber
    printf '%s\n' "[ca]" "default_ca = d" "[d]" "database = index.txt" "crlnumber = crlnumber" \
        "default_md = sha256" "default_crl_days = 30" >crl.cnf
    openssl ca -config crl.cnf -keyfile ca.key -cert ca.pem -gencrl -out crl.pem 2>/dev/null
  )
}

security_flags() {  # the secret and TLS flags of node $1 (a router or worker)
  local flags=()
  local keys="$CSN_STATE/keys" pki="$CSN_STATE/pki"
  [[ -f "$keys/cluster.secret" ]] && flags+=(--secret-file "$keys/cluster.secret")
  if [[ $1 == r* && -f "$keys/client.token" ]]; then
    flags+=(--client-token-file "$keys/client.token")
  fi
  if [[ -f "$pki/ca.pem" ]]; then
    flags+=(--tls-ca "$pki/ca.pem" --tls-cert "$pki/$1.pem" --tls-key "$pki/$1.key")
    [[ -f "$pki/crl.pem" ]] && flags+=(--tls-crl "$pki/crl.pem")
  fi
  echo "${flags[@]}"
}

# --- up -------------------------------------------------------------------------------------------

cmd_up() {
  local workers=3 routers=1 policy=ttft secret=0 tls=0 kv_mb=32 threads=1 owner=""
  local router_args="" worker_args=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --workers) workers="$2"; shift 2 ;;
      --routers) routers="$2"; shift 2 ;;
      --policy) policy="$2"; shift 2 ;;
      --secret) secret=1; shift ;;
      --tls) tls=1; shift ;;
      --kv-mb) kv_mb="$2"; shift 2 ;;
      --threads) threads="$2"; shift 2 ;;
      --router-args) router_args="$2"; shift 2 ;;
      --worker-args) worker_args="$2"; shift 2 ;;
      --owner) owner="$2"; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ $workers =~ ^[1-9][0-9]?$ && $workers -le 90 ]] || die "--workers: 1..90"
  [[ $routers =~ ^[1-9]$ ]] || die "--routers: 1..9"

  # Can this machine make the network at all?
  [[ $(id -u) == 0 ]] || skip "not root (network namespaces and TUN devices need root)"
  command -v ip >/dev/null || skip "no 'ip' command (install iproute2)"
  command -v python3 >/dev/null || skip "no python3"
  [[ -c /dev/net/tun ]] || skip "no /dev/net/tun (TUN devices)"
  local b
  for b in chunkserve-router chunkserve-worker chunkserve-loadgen; do
    [[ -x "$BIN/$b" ]] || die "missing $BIN/$b: build it first or set BIN"
  done
  if [[ $secret == 1 || $tls == 1 ]]; then
    command -v openssl >/dev/null || die "--secret/--tls need openssl"
  fi

  mkdir -p "$CSN_STATE"
  if [[ -f "$CSN_STATE/id" ]] && up_alive "$(cat "$CSN_STATE/id")"; then
    die "a cluster is already up in $CSN_STATE (pid $(cat "$CSN_STATE/id")):" \
        "run down first, or set CSN_STATE"
  fi
  clean_leftovers
  rm -rf "${CSN_STATE:?}"/{id,hosts,ready,seq,ack,ctl,ctl.lock,stats.json,logs,keys,pki,pids}
  mkdir -p "$CSN_STATE/logs"
  local id=$$ i h
  local hosts=(client)
  for i in $(seq 0 $((routers - 1))); do hosts+=("r$i"); done
  for i in $(seq 0 $((workers - 1))); do hosts+=("w$i"); done
  printf '%s\n' "${hosts[@]}" >"$CSN_STATE/hosts"
  : >"$CSN_STATE/pids"

  ready=0
  up_id="$id"  # global: the EXIT trap may run outside this function's scope
  on_exit() {
    teardown_group "$up_id"
    rm -f "$CSN_STATE/ready" "$CSN_STATE/id"
    if [[ $ready == 1 ]]; then echo "netns_cluster: down"; fi
  }
  trap on_exit EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  ip netns add "csn-$id-sw" 2>"$CSN_STATE/logs/netns.err" ||
    skip "ip netns add failed: $(cat "$CSN_STATE/logs/netns.err")"
  for h in "${hosts[@]}"; do ip netns add "csn-$id-$h"; done
  echo "$id" >"$CSN_STATE/id"

  # The switch, in its own namespace: it creates each host's TUN device and moves it in.
  local switch_args=()
  for h in "${hosts[@]}"; do switch_args+=(--host "$h=csn-$id-$h=$(host_addr "$h")"); done
  ip netns exec "csn-$id-sw" python3 "$here/netns_switch.py" "${switch_args[@]}" \
      --ctl "$CSN_STATE/ctl" --ack "$CSN_STATE/ack" --stats "$CSN_STATE/stats.json" \
      >"$CSN_STATE/logs/switch.log" 2>&1 &
  local switch_pid=$!
  echo "$switch_pid switch" >>"$CSN_STATE/pids"
  for _ in $(seq 300); do
    grep -q " ready" "$CSN_STATE/ack" 2>/dev/null && break
    kill -0 "$switch_pid" 2>/dev/null ||
      skip "the switch could not set up the links: $(tail -3 "$CSN_STATE/logs/switch.log")"
    sleep 0.1
  done
  grep -q " ready" "$CSN_STATE/ack" 2>/dev/null ||
    die "the switch did not come up; see $CSN_STATE/logs/switch.log"

  [[ $secret == 1 ]] && make_secrets
  local nodes=()
  for h in "${hosts[@]}"; do [[ $h == client ]] || nodes+=("$h"); done
  [[ $tls == 1 ]] && make_pki "${nodes[@]}"

  # Routers (router rK gets the K-th policy of the list, the last one repeating).
  local router_list=() addr policies=()
  IFS=, read -ra policies <<<"$policy"
  for i in $(seq 0 $((routers - 1))); do
    addr="$(host_addr "r$i")"
    router_list+=("$addr:$ROUTER_PORT")
    local p="${policies[-1]}"
    [[ $i -lt ${#policies[@]} ]] && p="${policies[$i]}"
    # shellcheck disable=SC2046,SC2086
    ip netns exec "csn-$id-r$i" "$BIN/chunkserve-router" --listen "$addr:$ROUTER_PORT" \
        --http "0.0.0.0:$ROUTER_HTTP" --policy "$p" --lease-ms 3000 \
        $(security_flags "r$i") $router_args >"$CSN_STATE/logs/r$i.log" 2>&1 &
    echo "$! r$i" >>"$CSN_STATE/pids"
  done
  for i in $(seq 0 $((routers - 1))); do
    for _ in $(seq 300); do
      grep -q "^listening on" "$CSN_STATE/logs/r$i.log" && break
      sleep 0.1
    done
    grep -q "^listening on" "$CSN_STATE/logs/r$i.log" ||
      die "router r$i did not start; see $CSN_STATE/logs/r$i.log"
  done

  # Workers: the built-in tiny model unless --worker-args names one.
  local model=()
  if [[ " $worker_args " != *" --model "* ]] &&
     "$BIN/chunkserve-worker" --help 2>&1 | grep -q -- "--tiny-model"; then
    model=(--tiny-model)
  fi
  local joined
  joined="$(IFS=,; echo "${router_list[*]}")"
  for i in $(seq 0 $((workers - 1))); do
    addr="$(host_addr "w$i")"
    # shellcheck disable=SC2046,SC2086
    ip netns exec "csn-$id-w$i" "$BIN/chunkserve-worker" "${model[@]}" \
        --listen "0.0.0.0:$WORKER_PORT" --http "0.0.0.0:$WORKER_HTTP" \
        --advertise "$addr:$WORKER_PORT" --worker-id "w$i" --router "$joined" \
        --threads "$threads" --kv-cache-mb "$kv_mb" --drain-timeout-ms 2000 \
        $(security_flags "w$i") $worker_args >"$CSN_STATE/logs/w$i.log" 2>&1 &
    echo "$! w$i" >>"$CSN_STATE/pids"
  done

  # Every router has every worker (a loaded machine may take a while: up to 120 s).
  local alive
  for i in $(seq 0 $((routers - 1))); do
    for _ in $(seq 600); do
      alive="$( (cmd_metrics "r$i" 'chunkserve_router_workers_alive ' 2>/dev/null || true) |
               awk '{print $2}')"
      [[ ${alive%.*} == "$workers" ]] && break
      sleep 0.2
    done
    [[ ${alive%.*} == "$workers" ]] ||
      die "router r$i has ${alive:-0} of $workers workers after 120 s; logs in $CSN_STATE/logs"
  done
  touch "$CSN_STATE/ready"
  ready=1
  echo "netns_cluster: ready: ${#hosts[@]} hosts in namespaces csn-$id-*," \
       "routers ${router_list[*]}, $workers workers; state in $CSN_STATE"

  while :; do
    if [[ -n $owner ]] && ! kill -0 "$owner" 2>/dev/null; then
      echo "netns_cluster: owner $owner is gone" >&2
      exit 0
    fi
    kill -0 "$switch_pid" 2>/dev/null || die "the switch exited; see $CSN_STATE/logs/switch.log"
    sleep 1 &
    wait $! || true
  done
}

# --- other commands -------------------------------------------------------------------------------

cmd_wait() {
  local secs="${1:-180}" id="" dead=0
  for _ in $(seq $((secs * 10))); do
    [[ -f "$CSN_STATE/ready" ]] && return 0
    # An id whose process is gone for 5 s: up failed (a new `up &` replaces a stale id at once).
    if [[ -f "$CSN_STATE/id" ]] && id="$(cat "$CSN_STATE/id")" && ! up_alive "$id"; then
      dead=$((dead + 1))
      [[ $dead -lt 50 ]] || die "up exited before the cluster was ready; see $CSN_STATE/logs"
    else
      dead=0
    fi
    sleep 0.1
  done
  die "the cluster was not ready within $secs s"
}

cmd_down() {
  [[ -f "$CSN_STATE/id" ]] || return 0
  local id
  id="$(cat "$CSN_STATE/id")"
  if up_alive "$id"; then
    kill -TERM "$id" 2>/dev/null || true
    for _ in $(seq 600); do up_alive "$id" || break; sleep 0.1; done
    up_alive "$id" && kill -KILL "$id" 2>/dev/null || true
  fi
  teardown_group "$id"  # if up could not (it was killed)
  rm -f "$CSN_STATE/id" "$CSN_STATE/ready"
}

cmd_metrics() {
  local host="$1" regex="${2:-}" ns port out
  ns="$(ns_of "$host")"
  port="$(host_http "$host")"
  out="$(ip netns exec "$ns" curl -sf --max-time 5 "http://127.0.0.1:$port/metrics")" ||
    die "no /metrics from $host"
  if [[ -n $regex ]]; then
    grep -E "^$regex" <<<"$out" || true
  else
    echo "$out"
  fi
}

cmd_loadgen() {
  local via=r0 env=() flags=()
  if [[ ${1:-} == --via ]]; then via="$2"; shift 2; fi
  local ns addr
  ns="$(ns_of client)"
  ns_of "$via" >/dev/null
  addr="$(host_addr "$via")"
  if [[ -f "$CSN_STATE/keys/client.token" ]]; then
    env+=("CHUNKSERVE_CLIENT_TOKEN=$(cat "$CSN_STATE/keys/client.token")")
  fi
  [[ -f "$CSN_STATE/pki/ca.pem" ]] && flags+=(--tls-ca "$CSN_STATE/pki/ca.pem")
  exec ip netns exec "$ns" env "${env[@]}" "$BIN/chunkserve-loadgen" \
      --target "$addr:$ROUTER_PORT" --metrics "$addr:$ROUTER_HTTP" "${flags[@]}" "$@"
}

cmd_status() {
  local id h
  id="$(cluster_id)"
  if up_alive "$id"; then
    echo "cluster $id (up pid $id), state $CSN_STATE"
  else
    echo "cluster $id: up process gone"
  fi
  while read -r h; do
    printf '  %-8s %-14s netns csn-%s-%s  pids %s\n' "$h" "$(host_addr "$h")" "$id" "$h" \
        "$(ip netns pids "csn-$id-$h" 2>/dev/null | tr '\n' ' ')"
  done <"$CSN_STATE/hosts"
  if up_alive "$id"; then ctl stats >/dev/null && cat "$CSN_STATE/stats.json"; fi
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  up) cmd_up "$@" ;;
  wait) cmd_wait "$@" ;;
  down) cmd_down ;;
  clean) clean_leftovers ;;
  shape) cmd_shape "$@" ;;
  cut)
    [[ $# -ge 1 && $# -le 2 ]] || die "usage: cut HOST [PEER]"
    for h in "$@"; do ns_of "$h" >/dev/null; done
    ctl cut "$@" ;;
  heal)
    [[ $# -ge 1 && $# -le 2 ]] || die "usage: heal HOST [PEER] | all"
    for h in "$@"; do [[ $h == all ]] || ns_of "$h" >/dev/null; done
    ctl heal "$@" ;;
  stats) ctl stats >/dev/null && cat "$CSN_STATE/stats.json" ;;
  status) cmd_status ;;
  metrics) [[ $# -ge 1 ]] || die "usage: metrics HOST [REGEX]"; cmd_metrics "$@" ;;
  loadgen) cmd_loadgen "$@" ;;
  exec)
    [[ $# -ge 2 ]] || die "usage: exec HOST CMD..."
    ns="$(ns_of "$1")"
    shift
    exec ip netns exec "$ns" "$@" ;;
  addr) [[ $# -eq 1 ]] || die "usage: addr HOST"; host_addr "$1" ;;
  log)
    [[ $# -eq 1 ]] || die "usage: log HOST"
    ns_of "$1" >/dev/null
    echo "$CSN_STATE/logs/$1.log" ;;
  *)
    sed -n '2,/^set -euo/p' "$self" | sed '$d' | sed 's/^# \{0,1\}//'
    [[ -z $cmd || $cmd == help || $cmd == -h || $cmd == --help ]] || exit 2 ;;
esac
