#!/usr/bin/env bash
# A Spark GPU discovery script for a one-machine cluster (local-cluster[N,...]): every
# call gets the next fake address ("0", then "1", ...), so each worker, and so each
# executor, owns its own GPU. Calls are serialised by a lock; the counter lives in
# $STS_FAKE_GPU_DIR (one folder per Spark application). Prints Spark's resource JSON.
set -euo pipefail
dir="${STS_FAKE_GPU_DIR:?STS_FAKE_GPU_DIR must name a folder for the address counter}"
mkdir -p "$dir"
exec 9>"$dir/lock"
flock 9
n=$(cat "$dir/next" 2>/dev/null || echo 0)
echo $((n + 1)) >"$dir/next"
printf '{"name": "gpu", "addresses": ["%s"]}\n' "$n"
