#!/usr/bin/env bash
# sts-spark: start one sidecar per GPU on a Databricks node (a cluster-scoped init script).
#
# What it does, on every node with GPUs (the driver only when STS_ON_DRIVER=1, e.g. on a
# single-node cluster whose driver runs the tasks):
#   1. installs sts-spark into its own venv ($STS_VENV), so the runtime's PySpark is untouched;
#   2. for each GPU that nvidia-smi lists, starts `sts sidecar` under a small restart loop,
#      detached from this script, with CUDA_VISIBLE_DEVICES=<index>, listening on the unix
#      socket $STS_RUN_DIR/sts-gpu<index>.sock (0660, in a 0770 folder) and writing results
#      into $STS_RESULTS_DIR, the folder the pipeline's results stream reads (it must be
#      shared by all nodes: a Unity Catalog volume or /dbfs path), logging to
#      $STS_LOG_DIR/sts-gpu<index>.log. The loop's process group id is in
#      $STS_RUN_DIR/sts-gpu<index>.pgid: `kill -TERM -- -$(cat .../sts-gpu0.pgid)` stops the
#      loop and drains the sidecar.
# It does not wait for the engines to load (vLLM takes a minute or more); the pipeline's
# start-up check reports sidecars that do not serve yet, and their requests get the fallback.
#
# The pipeline then uses, in conf/pipeline.yaml:
#   sidecar:
#     gpu_endpoint: "unix:///run/sts/sts-gpu{gpu}.sock"   # the GPU Spark gave the task
#     results_dir: /Volumes/main/sts/results              # = STS_RESULTS_DIR
#     launch: none                                        # the cluster started them
#
# Settings (cluster "Environment variables"; only STS_RESULTS_DIR is required):
#   STS_RESULTS_DIR     shared results folder (required)
#   STS_PIP_SPEC        what to pip install (default "sts-spark[gpu]"; or a wheel path in a volume)
#   STS_SIDECAR_CONFIG  sidecar YAML (e.g. a copy of conf/sidecar.yaml in a volume; default: built-in)
#   STS_SIDECAR_ARGS    extra `sts sidecar` arguments (e.g. "--model /Volumes/main/sts/models/m")
#   STS_VENV            venv folder (default /local_disk0/sts/venv)
#   STS_PYTHON          Python 3.11+ that builds the venv (default: the runtime's
#                       /databricks/python3/bin/python3, else python3)
#   STS_RUN_DIR         socket folder (default /run/sts)
#   STS_LOG_DIR         log folder (default /local_disk0/sts/logs)
#   STS_SOCKET_GROUP    group that may use the sockets (default: root's; set it when Python
#                       workers run as another user, as on shared-access clusters)
#   STS_ON_DRIVER       1 = start sidecars on the driver too (default 0)
set -euo pipefail

results_dir="${STS_RESULTS_DIR:?set STS_RESULTS_DIR to a folder all nodes share, e.g. /Volumes/main/sts/results}"
pip_spec="${STS_PIP_SPEC:-sts-spark[gpu]}"
venv="${STS_VENV:-/local_disk0/sts/venv}"
run_dir="${STS_RUN_DIR:-/run/sts}"
log_dir="${STS_LOG_DIR:-/local_disk0/sts/logs}"
config="${STS_SIDECAR_CONFIG:-}"
extra_args="${STS_SIDECAR_ARGS:-}"
python="${STS_PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x /databricks/python3/bin/python3 ]]; then python=/databricks/python3/bin/python3; else python=python3; fi
fi

if [[ "${DB_IS_DRIVER:-}" == "TRUE" && "${STS_ON_DRIVER:-0}" != "1" ]]; then
  echo "sts: driver node, no sidecars (STS_ON_DRIVER=1 to start them here)"
  exit 0
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "sts: no nvidia-smi on this node, no sidecars"
  exit 0
fi
mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')
if [[ ${#gpus[@]} -eq 0 ]]; then
  echo "sts: nvidia-smi lists no GPU, no sidecars"
  exit 0
fi

if [[ ! -x "$venv/bin/sts" ]]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "$pip_spec"
fi

mkdir -p "$run_dir" "$log_dir" "$results_dir"
chmod 0770 "$run_dir"
if [[ -n "${STS_SOCKET_GROUP:-}" ]]; then
  chgrp "$STS_SOCKET_GROUP" "$run_dir"
  chmod g+s "$run_dir"
fi

for gpu in "${gpus[@]}"; do
  args=(sidecar --listen "unix://$run_dir/sts-gpu$gpu.sock" --results-dir "$results_dir"
        --sidecar-id "$(hostname)-gpu$gpu")
  if [[ -n "$config" ]]; then
    args+=(--config "$config")
  fi
  # shellcheck disable=SC2206  # word splitting of the extra arguments is wanted
  args+=($extra_args)
  log="$log_dir/sts-gpu$gpu.log"
  # A restart loop per GPU, in its own session so it outlives this script.
  # shellcheck disable=SC2016  # $0 and $@ expand in the inner bash, not here
  CUDA_VISIBLE_DEVICES="$gpu" setsid bash -c '
    umask 0007
    while true; do
      "$0" "$@"
      echo "sts: sidecar exited with $?; restarting in 5 s"
      sleep 5
    done' "$venv/bin/sts" "${args[@]}" >>"$log" 2>&1 </dev/null &
  echo "$!" >"$run_dir/sts-gpu$gpu.pgid"
  echo "sts: sidecar for GPU $gpu on unix://$run_dir/sts-gpu$gpu.sock (log $log)"
done
