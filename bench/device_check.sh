#!/usr/bin/env bash
# The checks that need a CUDA device, as one short script for a lent GPU machine.
#
#   bash bench/device_check.sh prepare          # where PyPI is reachable: the wheels a GPU image with
#                                               # PyTorch usually lacks (pulp, dpkt, ahocorasick-rs),
#                                               # for its Python (PY_VERSION, default 3.12), in .whl/
#                                               # (.whl/ is ignored by git: send it along with the tree)
#   bash bench/device_check.sh run [OUT]        # on the GPU machine (no network needed): install them
#                                               # and dl-nfv, then
#     1. the GPU tests (`pytest -m gpu`: NCCL data parallelism against a single process, a CUDA
#        profile, the NFV tensor path on CUDA against the CPU path),
#     2. a CUDA profile of ResNet-50 and a plan of it simulated (the figures a GPU gives),
#     3. the NFV engines benchmark with the tensor path on CUDA (FlowShader's goals), which
#        rewrites the `nfv` section of docs/benchmarks.md;
#   logs and docs/benchmarks.md are copied to OUT (default: $OUT, else device-out/).
#
# Everything also runs without CUDA (the GPU tests then skip and the tensor path runs on the CPU),
# which is how the script itself is checked. CHECK_QUICK=1 profiles the MLP instead of ResNet-50
# and runs the benchmark's quick sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-run}
py=${PYTHON:-python3}

case "$mode" in
prepare)
  mkdir -p .whl
  if [ -d .git ] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    echo '/.whl/' >> .git/info/exclude
  fi
  # the versions this environment runs (tested), else the latest
  pins=$("$py" -c '
from importlib.metadata import PackageNotFoundError, version
def pin(name):
    try:
        return f"{name}=={version(name)}"
    except PackageNotFoundError:
        return name
print(" ".join(pin(n) for n in ("pulp", "dpkt", "ahocorasick-rs")))')
  rm -f .whl/*.whl
  # shellcheck disable=SC2086
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl $pins
  ls .whl
  ;;
run)
  out=${2:-${OUT:-device-out}}
  mkdir -p "$out"
  export PYTHONUNBUFFERED=1
  if ! "$py" -c "import dl_nfv.cli.main" 2>/dev/null; then  # (dl_nfv/ alone imports from here)
    if ls .whl/*.whl >/dev/null 2>&1; then
      "$py" -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
    fi
    "$py" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  fi
  PATH="$("$py" -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH"
  "$py" - <<'EOF' | tee "$out/device.txt"
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
EOF
  echo "== 1. GPU tests"
  "$py" -m pytest -m gpu -p no:cacheprovider -q tests 2>&1 | tee "$out/gpu-tests.log"
  echo "== 2. a CUDA profile, planned and simulated"
  model=${CHECK_QUICK:+mlp}
  dl-nfv profile model "${model:-resnet50}" --batch-size 32 --device auto -o "$out/graph.json" \
    2>&1 | tee "$out/profile.log"
  dl-nfv plan compare --graph "$out/graph.json" --topology examples/topologies/tag-hetero16.yaml \
    --planners pipeline,gpipe,1f1b,pipedream,dp -o "$out/compare.json" 2>&1 | tee "$out/compare.log"
  echo "== 3. NFV engines with the tensor path on CUDA"
  "$py" bench/nfv_bench.py ${CHECK_QUICK:+--quick} 2>&1 | tee "$out/nfv-bench.log"
  cp docs/benchmarks.md "$out/benchmarks.md"
  ;;
*)
  echo "usage: bash bench/device_check.sh prepare | run [OUT]" >&2
  exit 2
  ;;
esac
