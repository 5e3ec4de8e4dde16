#!/usr/bin/env bash
# The first set of benchmarks/JOURNAL.md, one after the other (~80 min on 2 cores); the
# figures that hold today and their commands: benchmarks/RESULTS.md.
#   bash scripts/run_benchmarks.sh [OUT_DIR]      (default benchmarks/results)
set -euo pipefail
cd "$(dirname "$0")/.."
export SPARK_LOCAL_IP=127.0.0.1
OUT=${1:-benchmarks/results}
mkdir -p "$OUT"

# 1. Gateway overhead: submissions/s on one core, latency the sidecar adds.
python -m benchmarks.gateway_overhead --out "$OUT/gateway_overhead.json"

# 2. Seed scale, simulated: QPS up to 200, 3 s SLA for high, 10 simulated H100s.
sts bench --engine simulated --profile seed-200qps --sidecar-config conf/sidecar-seed-sim.yaml \
  --rates 50,100,200 --duration 20 --out "$OUT/seed-sim"

# 3. Real vLLM on CPU (SmolLM2-135M), rates scaled to this machine.
sts bench --engine vllm --profile cpu-small --rates 0.5,1,2,4 --duration 30 --out "$OUT/cpu-vllm"

# 4. The sidecar's own knee on real vLLM.
sts bench --knee --engine vllm --profile cpu-small --duration 40 --out "$OUT/cpu-vllm-knee"

# 5. Priority under 10x overload (simulated engine; --engine vllm for the real one).
python -m benchmarks.overload --engine simulated

# 6. Answer write cost as the answers table grows (10k, 100k, 1M rows).
python -m benchmarks.delta_growth --out "$OUT/delta_growth"
python -m benchmarks.delta_append --out "$OUT/delta_append/delta_append.json"
python -m benchmarks.delta_log_listing --out "$OUT/delta_log_listing/delta_log_listing.json"

# 7. The rebuilt answer path at seed scale, with per-hop latencies (SIMULATION).
sts bench --engine simulated --profile seed-200qps --sidecar-config conf/sidecar-seed-sim.yaml \
  --rates 200 --duration 20 --schemes engine,sts,baseline-sync --out "$OUT/seed-sim-200"

# 8. Seed scale over Kafka: the files path and the Kafka path in one run (local broker).
sts bench --engine simulated --profile seed-200qps --sidecar-config conf/sidecar-seed-sim.yaml \
  --rates 50,200 --duration 20 --schemes engine,sts-kafka,sts --out "$OUT/seed-sim-kafka"

# 9. The submit query in Spark's Real-Time Mode vs micro-batch, and what RTM refuses.
python -m benchmarks.realtime_mode --rates 50,200 --duration 20 --probe \
  --out "$OUT/realtime_mode/realtime_mode.json"
python -m benchmarks.realtime_mode --rates 50,200 --duration 20 --modes realtime-small-buffers \
  --small-arrow-batch 10 --out "$OUT/realtime_mode/realtime_mode_arrow_batch_10.json"
