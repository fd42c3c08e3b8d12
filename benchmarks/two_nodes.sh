#!/usr/bin/env bash
# Run a command against a two-node Ray cluster on this machine, kept on loopback (root, unshare):
#   sudo benchmarks/two_nodes.sh python benchmarks/weight_sync.py --models tiny --no-server-process
# The head and this command share one network namespace whose only interface is lo and a private
# tmpfs /dev/shm; the second node has its own tmpfs /dev/shm and offers agentgym_trainer_pool, so the
# trainer's rank 0 goes there. RAY_ADDRESS is set for the command. The cluster's processes (those
# naming its temp dir) are ended afterwards. tests/trainer/test_multinode.py does the same.
set -euo pipefail
if [ "${AGENTGYM_IN_NS:-}" != 1 ]; then
  exec env AGENTGYM_IN_NS=1 unshare -n -m --propagation private "$0" "$@"
fi
TEMP="/tmp/agentgym-2n-$$"
export RAY_AUTH_MODE=disabled TOKENIZERS_PARALLELISM=false
BIN="$(dirname "$(command -v python)")"
stop() {
  for pid in $(grep -l -a "$TEMP" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3); do
    [ "$pid" != $$ ] && kill "$pid" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$TEMP"
}
trap stop EXIT
ip link set lo up
mount -t tmpfs tmpfs /dev/shm
"$BIN/ray" start --head --node-ip-address 127.0.0.1 --port 6379 --num-cpus 2 --temp-dir "$TEMP" \
  --include-dashboard false --disable-usage-stats >/dev/null
unshare -m --propagation private sh -c "mount -t tmpfs tmpfs /dev/shm && '$BIN/ray' start --address 127.0.0.1:6379 \
  --node-ip-address 127.0.0.1 --num-cpus 2 --resources '{\"agentgym_trainer_pool\": 1}' --disable-usage-stats" >/dev/null
RAY_ADDRESS=127.0.0.1:6379 "$@"
