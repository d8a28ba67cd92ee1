#!/usr/bin/env bash
# The main job on built-in defaults: the cluster examples, the device catalog.
# Writes its artifacts to demo-out/. Run through `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=demo-out
mkdir -p "$out"
echo "== the device catalog"
dl-nfv profile devices
echo "== the TAG heterogeneous cluster (16 GPUs, 3 types, 22.5 Gbps between machines)"
dl-nfv show examples/topologies/tag-hetero16.yaml
dl-nfv show examples/topologies/tag-hetero16.yaml --json > "$out/tag-hetero16.json"
echo "demo artifacts in $out/"
