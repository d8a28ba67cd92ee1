#!/usr/bin/env bash
# The main job on built-in defaults, end to end on this machine:
#   profile real models -> compare planners on heterogeneous clusters -> simulate with a trace
#   -> train a plan for real on two local workers and hold the simulator to account
#   -> run network functions over a skewed HTTP trace on every engine.
# Artifacts land in demo-out/ (open demo-out/trace.json in https://ui.perfetto.dev).
# Run through `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
out=demo-out
topo=examples/topologies
mkdir -p "$out"
step() { printf '\n== %s\n' "$*"; }

step "the device catalog and the TAG heterogeneous cluster"
dl-nfv profile devices
dl-nfv show "$topo/tag-hetero16.yaml"

step "profile GPT-2 small (layer granularity) on this CPU"
dl-nfv profile model gpt2-small --batch-size 8 --seq-len 128 --granularity layer --repeats 2 \
  -o "$out/gpt2.json"
dl-nfv show "$out/gpt2.json"

step "pipeline planning against its baselines on the 16-GPU heterogeneous cluster"
dl-nfv plan compare --graph "$out/gpt2.json" --topology "$topo/tag-hetero16.yaml" \
  --planners pipeline,gpipe,1f1b,pipedream,dp,dp-ps -o "$out/compare-pipeline.json"
dl-nfv plan pipeline --graph "$out/gpt2.json" --topology "$topo/tag-hetero16.yaml" \
  -o "$out/plan-pipeline.json"
dl-nfv simulate "$out/plan-pipeline.json" -o "$out/sim-pipeline.json" --trace "$out/trace.json"
dl-nfv show "$out/sim-pipeline.json"

step "op placement (FastT) against Baechi's placers on the HeteroG testbed"
dl-nfv profile model inception-v3 --batch-size 4 --repeats 2 -o "$out/inception.json"
dl-nfv plan compare --graph "$out/inception.json" --topology "$topo/heterog-testbed8.yaml" \
  --planners fastt,m-topo,m-etf,m-sct,dp,single -o "$out/compare-placement.json"

step "train for real on two local worker processes, then compare with the simulator"
dl-nfv profile model mlp --threads 1 --repeats 3 -o "$out/mlp.json"
dl-nfv plan dp --graph "$out/mlp.json" --topology "$topo/local-cpu.yaml" -o "$out/plan-local.json"
dl-nfv train "$out/plan-local.json" --steps 20 -o "$out/run-local.json"
dl-nfv simulate "$out/plan-local.json" --compare "$out/run-local.json"

step "network functions: a skewed HTTP trace through the IDS on every engine"
dl-nfv nfv gen-trace --flows 4000 --size-dist zipf:1.2 --mix http --seed 0 -o "$out/skewed.pcap"
dl-nfv nfv inspect "$out/skewed.pcap"
dl-nfv nfv bench --config examples/nf/ids.yaml --trace "$out/skewed.pcap" \
  --engines cpu,gpu,flowshader -o "$out/nfv-bench.json"

step "done: artifacts in $out/"
