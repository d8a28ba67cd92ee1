"""Bad input across every command: exit 2, one line on stderr, no traceback, outputs untouched.

The table holds a bad file, option value or output path for every command, each run
in-process with a pre-existing output file that must come out byte-identical.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from dl_nfv.planners import PLANNERS
from tests.artifacts.fixtures import GRAPH, fresh

from .workspace import TOPOLOGY, invoke, make_workspace

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover
    HAS_CUDA = False


def _topology(**changes) -> dict:
    doc = yaml.safe_load(TOPOLOGY.read_text())
    device = doc["hosts"][0]["devices"][0]
    for key, value in changes.items():
        if key == "devices":
            doc["hosts"][0]["devices"] = value
        elif key == "nic_bandwidth":
            doc["hosts"][0]["interconnect"]["bandwidth_gbps"] = value
        else:
            device[key] = value
    return doc


def _graph(**changes) -> dict:
    doc = fresh(GRAPH)
    doc["ops"][1].update(changes)
    return doc


# name -> (suffix, content: str, bytes or a document)
BAD_FILES = {
    "yaml_syntax": (".yaml", "kind: topology\nschema_version: 1\nhosts: [\n"),
    "json_syntax": (".json", '{"kind": "plan",'),
    "a_list": (".yaml", "- 1\n- 2\n"),
    "empty": (".yaml", ""),
    "binary": (".json", b"\x89PNG\r\n\x1a\n\x00\xff\xfe"),
    "no_kind": (".yaml", {"schema_version": 1}),
    "unknown_kind": (".yaml", {"kind": "not-a-kind", "schema_version": 1}),
    "future": (".yaml", {**_topology(), "schema_version": 999}),
    "huge_count": (".yaml", _topology(count=10**12)),
    "count_text": (".yaml", "kind: topology\nschema_version: 1\nname: x\nhosts:\n- name: h\n"
                            "  devices:\n  - {type: cpu, count: 1e12}\n"),
    "count_4097": (".yaml", _topology(count=4097)),
    "host_over_limit": (".yaml", _topology(devices=[{"type": "cpu", "count": 3000},
                                                    {"type": "cpu", "count": 3000,
                                                     "prefix": "more"}])),
    "count_zero": (".yaml", _topology(count=0)),
    "neg_bandwidth": (".yaml", _topology(nic_bandwidth=-5)),
    "inf_bandwidth": (".yaml", _topology(nic_bandwidth=math.inf)),
    "nan_flops": (".json", _graph(flops=math.nan)),
    "neg_flops": (".json", _graph(flops=-1)),
    "other_graph": (".json", {**fresh(GRAPH), "model": {**GRAPH["model"], "batch_size": 16,
                                                         "inputs": [{"shape": [16, 16]}]}}),
    "trace_bad_event": (".json", {"traceEvents": [1]}),
    "trace_bad_ts": (".json", {"traceEvents": [{"ph": "X", "ts": "soon", "dur": 1, "pid": 1,
                                                "tid": 1}]}),
    "cmp_unknown_key": (".json", {"kind": "plan-comparison", "schema_version": 1, "graph": "g",
                                  "topology": "t", "rows": [{"planner": "dp", "feasible": True,
                                                             "colour": 1}]}),
    "cmp_no_rows": (".json", {"kind": "plan-comparison", "schema_version": 1, "graph": "g",
                              "topology": "t", "rows": []}),
    "cmp_silent_infeasible": (".json", {"kind": "plan-comparison", "schema_version": 1,
                                        "graph": "g", "topology": "t",
                                        "rows": [{"planner": "dp", "feasible": False}]}),
    "bench_share": (".json", {"kind": "nfv-bench", "schema_version": 1, "trace": "t.pcap",
                              "messages": 1, "flows": 1, "payload_bytes": 1,
                              "outputs_identical": True,
                              "engines": [{"engine": "cpu", "gbps": 1, "messages_per_s": 1,
                                           "elapsed_s": 1, "gpu_message_share": 2, "batches": 1,
                                           "device": "cpu", "workers": 1, "alerts": 0}]}),
    "nf_unknown": (".yaml", {"kind": "nf-config", "schema_version": 1, "name": "x",
                             "chain": [{"nf": "teleport"}]}),
    "pcap_garbage": (".pcap", b"this is not a capture file at all"),
    "pcap_empty": (".pcap", b""),
    "pipedream_garbage": (".txt", "node1 -- this is not a profile\n"),
    "placement_not_json": (".json", "not json"),
}

# name -> the fusion field put into the workspace's data-parallel plan of mlp-tiny
BAD_FUSIONS = {
    "fuse_unknown_op": {"op_groups": [["layers_fc0", "no_such_op"]]},
    "fuse_non_adjacent": {"op_groups": [["flatten", "layers_relu0"]]},
    "gradient_in_two_buckets": {"gradient_buckets": [["head", "layers_fc1"], ["layers_fc1",
                                                                              "layers_fc0"]]},
    "gradient_in_no_bucket": {"gradient_buckets": [["head"], ["layers_fc1"]]},
}
B = {name: "{bad_" + name + "}" for name in (*BAD_FILES, *BAD_FUSIONS)}
PLAN_IO = ["--graph", "{g}", "--topology", "{t}"]
RUN = ["--config", "{cfg}", "--trace", "{pcap}"]
NETSTAR = str(TOPOLOGY.parents[1] / "nf" / "netstar-ids.yaml")
L4 = str(TOPOLOGY.parents[1] / "nf" / "fw-nat-lb.yaml")
ACTORS = ["--cluster", str(TOPOLOGY.parents[1] / "nf" / "actors-local.yaml")]
OUT = ["-o", "{pre}"]  # a file that exists before every case and must not change

CASES: list[tuple[str, list[str]]] = [
    # the root and unknown commands
    ("unknown option", ["--bogus"]),
    ("unknown command", ["frobnicate"]),
    ("unknown plan command", ["plan", "nosuch"]),
    ("unknown nfv command", ["nfv", "nosuch"]),
    # show: every way a file can be wrong
    ("show missing file", ["show", "{dir}/nope.yaml"]),
    ("show a folder", ["show", "{dir}"]),
    *[(f"show {name}", ["show", B[name]]) for name in BAD_FILES
      if name not in ("other_graph", "pipedream_garbage", "pcap_garbage", "pcap_empty")],
    ("show --width 0", ["show", "{plan}", "--width", "0"]),
    ("show --width -5", ["show", "{plan}", "--width", "-5"]),
    ("show --width text", ["show", "{plan}", "--width", "wide"]),
    # plan <planner>: ranges, choices, NaN, files, outputs
    ("dp --bucket-mb -1", ["plan", "dp", *PLAN_IO, "--bucket-mb", "-1", *OUT]),
    ("dp --bucket-mb nan", ["plan", "dp", *PLAN_IO, "--bucket-mb", "nan", *OUT]),
    ("dp --bucket-mb inf", ["plan", "dp", *PLAN_IO, "--bucket-mb", "inf", *OUT]),
    ("dp --bucket-mb text", ["plan", "dp", *PLAN_IO, "--bucket-mb", "lots", *OUT]),
    ("dp --sync", ["plan", "dp", *PLAN_IO, "--sync", "gossip", *OUT]),
    ("dp --collective", ["plan", "dp", *PLAN_IO, "--collective", "butterfly", *OUT]),
    ("dp --optimizer", ["plan", "dp", *PLAN_IO, "--optimizer", "lamb", *OUT]),
    ("dp --balance", ["plan", "dp", *PLAN_IO, "--balance", "random", *OUT]),
    ("dp --devices unknown", ["plan", "dp", *PLAN_IO, "--devices", "nohost/gpu9", *OUT]),
    ("dp --seed text", ["plan", "dp", *PLAN_IO, "--seed", "abc", *OUT]),
    ("dp -o .txt in a folder", ["plan", "dp", *PLAN_IO, "-o", "{dir}/out.txt"]),
    ("dp -o no extension", ["plan", "dp", *PLAN_IO, "-o", "{dir}/out"]),
    ("dp -o missing folder", ["plan", "dp", *PLAN_IO, "-o", "{dir}/missing/out.json"]),
    ("dp -o under a file", ["plan", "dp", *PLAN_IO, "-o", "{pre}/out.json"]),
    ("dp -o a folder", ["plan", "dp", *PLAN_IO, "-o", "{dir}/sub.json"]),
    ("dp -o in /proc", ["plan", "dp", *PLAN_IO, "-o", "/proc/dl-nfv-out.json"]),
    ("dp missing --topology", ["plan", "dp", "--graph", "{g}", *OUT]),
    ("dp graph is a topology", ["plan", "dp", "--graph", "{t}", "--topology", "{t}", *OUT]),
    ("dp topology is a graph", ["plan", "dp", "--graph", "{g}", "--topology", "{g}", *OUT]),
    ("dp missing graph", ["plan", "dp", "--graph", "{dir}/nope.json", "--topology", "{t}", *OUT]),
    ("dp graph json syntax", ["plan", "dp", "--graph", B["json_syntax"], "--topology", "{t}", *OUT]),
    ("dp graph nan", ["plan", "dp", "--graph", B["nan_flops"], "--topology", "{t}", *OUT]),
    ("dp topology count 1e12", ["plan", "dp", "--graph", "{g}", "--topology", B["huge_count"],
                                *OUT]),
    ("dp topology count text", ["plan", "dp", "--graph", "{g}", "--topology", B["count_text"],
                                *OUT]),
    ("dp-ps --collective hidden", ["plan", "dp-ps", *PLAN_IO, "--collective", "ring", *OUT]),
    ("dp-ps --sync hidden", ["plan", "dp-ps", *PLAN_IO, "--sync", "ps", *OUT]),
    ("single --optimizer", ["plan", "single", *PLAN_IO, "--optimizer", "rmsprop", *OUT]),
    ("single -o .csv", ["plan", "single", *PLAN_IO, "-o", "{dir}/plan.csv"]),
    ("pipeline --time-limit nan", ["plan", "pipeline", *PLAN_IO, "--time-limit", "nan", *OUT]),
    ("pipeline --time-limit -inf", ["plan", "pipeline", *PLAN_IO, "--time-limit", "-inf", *OUT]),
    ("pipeline --time-limit -1", ["plan", "pipeline", *PLAN_IO, "--time-limit", "-1", *OUT]),
    ("pipeline --microbatches -1", ["plan", "pipeline", *PLAN_IO, "--microbatches", "-1", *OUT]),
    ("pipeline --max-stages -1", ["plan", "pipeline", *PLAN_IO, "--max-stages", "-1", *OUT]),
    ("pipeline --schedule", ["plan", "pipeline", *PLAN_IO, "--schedule", "zigzag", *OUT]),
    ("gpipe --stages -1", ["plan", "gpipe", *PLAN_IO, "--stages", "-1", *OUT]),
    ("gpipe --balance", ["plan", "gpipe", *PLAN_IO, "--balance", "luck", *OUT]),
    ("gpipe --microbatches text", ["plan", "gpipe", *PLAN_IO, "--microbatches", "four", *OUT]),
    ("1f1b --stages -2", ["plan", "1f1b", *PLAN_IO, "--stages", "-2", *OUT]),
    ("pipedream --activation-compression-ratio -1",
     ["plan", "pipedream", *PLAN_IO, "--activation-compression-ratio", "-1", *OUT]),
    ("pipedream --activation-compression-ratio nan",
     ["plan", "pipedream", *PLAN_IO, "--activation-compression-ratio", "nan", *OUT]),
    ("fastt --memory-fraction 2", ["plan", "fastt", *PLAN_IO, "--memory-fraction", "2", *OUT]),
    ("fastt --memory-fraction nan", ["plan", "fastt", *PLAN_IO, "--memory-fraction", "nan", *OUT]),
    ("fastt --max-split -1", ["plan", "fastt", *PLAN_IO, "--max-split", "-1", *OUT]),
    ("fastt --split-rounds -1", ["plan", "fastt", *PLAN_IO, "--split-rounds", "-1", *OUT]),
    ("fastt --time-limit -1", ["plan", "fastt", *PLAN_IO, "--time-limit", "-1", *OUT]),
    ("fastt --refine-with missing", ["plan", "fastt", *PLAN_IO, "--refine-with",
                                     "{dir}/nope.json", *OUT]),
    ("disco --time-limit 0", ["plan", "disco", *PLAN_IO, "--time-limit", "0", *OUT]),
    ("disco --max-evaluations -1", ["plan", "disco", *PLAN_IO, "--max-evaluations", "-1", *OUT]),
    ("m-topo --memory-fraction 1.5", ["plan", "m-topo", *PLAN_IO, "--memory-fraction", "1.5", *OUT]),
    ("m-etf --memory-fraction inf", ["plan", "m-etf", *PLAN_IO, "--memory-fraction", "inf", *OUT]),
    ("m-sct --memory-fraction -1", ["plan", "m-sct", *PLAN_IO, "--memory-fraction", "-1", *OUT]),
    *[(f"{name} -o .txt", ["plan", name, *PLAN_IO, "-o", "{dir}/p.txt"]) for name in PLANNERS],
    *[(f"{name} --seed nan", ["plan", name, *PLAN_IO, "--seed", "nan", *OUT]) for name in PLANNERS],
    # plan compare / list / export
    ("compare --planners ''", ["plan", "compare", *PLAN_IO, "--planners", "", *OUT]),
    ("compare --planners ','", ["plan", "compare", *PLAN_IO, "--planners", " , ", *OUT]),
    ("compare --planners unknown", ["plan", "compare", *PLAN_IO, "--planners", "dp,nosuch", *OUT]),
    ("compare --planners twice", ["plan", "compare", *PLAN_IO, "--planners", "dp,dp", *OUT]),
    ("compare --time-limit nan", ["plan", "compare", *PLAN_IO, "--time-limit", "nan", *OUT]),
    ("compare --time-limit -1", ["plan", "compare", *PLAN_IO, "--time-limit", "-1", *OUT]),
    ("compare --optimizer", ["plan", "compare", *PLAN_IO, "--optimizer", "lamb", *OUT]),
    ("compare -o .txt", ["plan", "compare", *PLAN_IO, "-o", "{dir}/cmp.txt"]),
    ("compare missing graph", ["plan", "compare", "--graph", "{dir}/g0.json", "--topology", "{t}",
                               *OUT]),
    ("list --bogus", ["plan", "list", "--bogus"]),
    ("export missing plan", ["plan", "export", "{dir}/nope.json", "-o", "{dir}/exp"]),
    ("export a graph", ["plan", "export", "{g}", "-o", "{dir}/exp"]),
    ("export a plan without a pipeline", ["plan", "export", "{plan}", "-o", "{dir}/exp"]),
    ("export --format", ["plan", "export", "{plan}", "--format", "megatron", "-o", "{dir}/exp"]),
    ("export -o under a file", ["plan", "export", "{plan}", "-o", "{pre}/exp"]),
    ("sfb missing plan", ["plan", "sfb", "{dir}/nope.json", *OUT]),
    ("sfb a graph", ["plan", "sfb", "{g}", *OUT]),
    ("sfb another graph", ["plan", "sfb", "{plan}", "--graph", B["other_graph"], *OUT]),
    ("sfb another topology", ["plan", "sfb", "{plan}", "--topology",
                              str(TOPOLOGY.parent / "a100-2x4-25g.yaml"), *OUT]),
    ("sfb --time-limit -1", ["plan", "sfb", "{plan}", "--time-limit", "-1", *OUT]),
    ("sfb -o .txt", ["plan", "sfb", "{plan}", "-o", "{dir}/p.txt"]),
    # simulate
    ("simulate missing plan", ["simulate", "{dir}/nope.json", *OUT]),
    ("simulate a topology", ["simulate", "{t}", *OUT]),
    ("simulate another graph", ["simulate", "{plan}", "--graph", B["other_graph"], *OUT]),
    ("simulate a bad topology", ["simulate", "{plan}", "--topology", B["neg_bandwidth"], *OUT]),
    ("simulate -o .txt", ["simulate", "{plan}", "-o", "{dir}/sim.txt"]),
    ("simulate --trace .txt", ["simulate", "{plan}", "--trace", "{dir}/trace.txt", *OUT]),
    ("simulate --trace .yaml", ["simulate", "{plan}", "--trace", "{dir}/trace.yaml", *OUT]),
    ("simulate --trace missing folder", ["simulate", "{plan}", "--trace", "{dir}/no/trace.json",
                                         *OUT]),
    *[(f"simulate {name}", ["simulate", B[name], *OUT]) for name in BAD_FUSIONS],
    *[(f"train {name}", ["train", B[name], *OUT]) for name in BAD_FUSIONS],
    ("simulate --compare missing", ["simulate", "{plan}", "--compare", "{dir}/nope.json", *OUT]),
    ("simulate --compare a plan", ["simulate", "{plan}", "--compare", "{plan}", *OUT]),
    ("simulate --estimator a graph", ["simulate", "{plan}", "--estimator", "{g}", *OUT]),
    ("simulate --estimator missing", ["simulate", "{plan}", "--estimator", "{dir}/nope.json", *OUT]),
    # train: refused before any worker starts
    ("train --lr -1", ["train", "{plan}", "--lr", "-1", *OUT]),
    ("train --lr 0", ["train", "{plan}", "--lr", "0", *OUT]),
    ("train --lr nan", ["train", "{plan}", "--lr", "nan", *OUT]),
    ("train --steps 0", ["train", "{plan}", "--steps", "0", *OUT]),
    ("train --warmup -1", ["train", "{plan}", "--warmup", "-1", *OUT]),
    ("train --threads 0", ["train", "{plan}", "--threads", "0", *OUT]),
    ("train --timeout-s 0", ["train", "{plan}", "--timeout-s", "0", *OUT]),
    ("train --timeout-s inf", ["train", "{plan}", "--timeout-s", "inf", *OUT]),
    ("train --backend", ["train", "{plan}", "--backend", "mpi", *OUT]),
    ("train -o .txt", ["train", "{plan}", "-o", "{dir}/run.txt"]),
    ("train --trace /dev/null", ["train", "{plan}", "--trace", "/dev/null", *OUT]),
    ("train --trace .txt", ["train", "{plan}", "--trace", "{dir}/t.txt", *OUT]),
    ("train missing plan", ["train", "{dir}/nope.json", *OUT]),
    ("train a graph", ["train", "{g}", *OUT]),
    # profile
    ("profile model unknown", ["profile", "model", "no-such-model", *OUT]),
    ("profile model --batch-size 0", ["profile", "model", "mlp-tiny", "--batch-size", "0", *OUT]),
    ("profile model --seq-len 0", ["profile", "model", "gpt2-tiny", "--seq-len", "0", *OUT]),
    ("profile model --repeats 0", ["profile", "model", "mlp-tiny", "--repeats", "0", *OUT]),
    ("profile model --warmup -1", ["profile", "model", "mlp-tiny", "--warmup", "-1", *OUT]),
    ("profile model --span -1", ["profile", "model", "mlp-tiny", "--span", "-1", *OUT]),
    ("profile model --threads 0", ["profile", "model", "mlp-tiny", "--threads", "0", *OUT]),
    ("profile model --device", ["profile", "model", "mlp-tiny", "--device", "tpu", *OUT]),
    ("profile model --dtype", ["profile", "model", "mlp-tiny", "--dtype", "int3", *OUT]),
    ("profile model --granularity", ["profile", "model", "mlp-tiny", "--granularity", "atom", *OUT]),
    ("profile model --input-shape 0", ["profile", "model", "mlp-tiny", "--input-shape", "0,3", *OUT]),
    ("profile model --input-shape text", ["profile", "model", "mlp-tiny", "--input-shape", "a,b",
                                          *OUT]),
    ("profile model -o .txt", ["profile", "model", "mlp-tiny", "-o", "{dir}/g.txt"]),
    ("profile network --nprocs 0", ["profile", "network", "--nprocs", "0", *OUT]),
    ("profile network --min-bytes 0", ["profile", "network", "--min-bytes", "0", *OUT]),
    ("profile network --repeats 0", ["profile", "network", "--repeats", "0", *OUT]),
    ("profile network --warmup -1", ["profile", "network", "--warmup", "-1", *OUT]),
    ("profile network --backend", ["profile", "network", "--backend", "tcp", *OUT]),
    ("profile network -o .txt", ["profile", "network", "-o", "{dir}/t.txt"]),
    ("profile network --report .txt", ["profile", "network", "--report", "{dir}/r.txt", *OUT]),
    ("profile devices --bogus", ["profile", "devices", "--bogus"]),
    ("profile models --bogus", ["profile", "models", "--bogus"]),
    ("import pipedream missing", ["profile", "import", "pipedream", "{dir}/nope.txt", *OUT]),
    ("import pipedream garbage", ["profile", "import", "pipedream", B["pipedream_garbage"], *OUT]),
    ("import pipedream --batch-size 0", ["profile", "import", "pipedream", B["pipedream_garbage"],
                                         "--batch-size", "0", *OUT]),
    ("import pipedream -o .txt", ["profile", "import", "pipedream", B["pipedream_garbage"], "-o",
                                  "{dir}/g.txt"]),
    ("import placement missing", ["profile", "import", "placement-json", "{dir}/nope.json", *OUT]),
    ("import placement not json", ["profile", "import", "placement-json",
                                   B["placement_not_json"], *OUT]),
    ("import placement --transfer-gbps 0", ["profile", "import", "placement-json",
                                            B["placement_not_json"], "--transfer-gbps", "0", *OUT]),
    ("import placement --transfer-gbps nan", ["profile", "import", "placement-json",
                                              B["placement_not_json"], "--transfer-gbps", "nan",
                                              *OUT]),
    # nfv
    ("gen-trace --attack-rate 2", ["nfv", "gen-trace", "--flows", "10", "--attack-rate", "2",
                                   "-o", "{prepcap}"]),
    ("gen-trace --attack-rate -0.1", ["nfv", "gen-trace", "--attack-rate", "-0.1",
                                      "-o", "{prepcap}"]),
    ("gen-trace --attack-rate nan", ["nfv", "gen-trace", "--attack-rate", "nan", "-o", "{prepcap}"]),
    ("gen-trace --flows 0", ["nfv", "gen-trace", "--flows", "0", "-o", "{prepcap}"]),
    ("gen-trace --flows -5", ["nfv", "gen-trace", "--flows", "-5", "-o", "{prepcap}"]),
    ("gen-trace --flows too many", ["nfv", "gen-trace", "--flows", "10000000", "-o", "{prepcap}"]),
    ("gen-trace --mean-exchanges 0", ["nfv", "gen-trace", "--mean-exchanges", "0",
                                      "-o", "{prepcap}"]),
    ("gen-trace --mean-exchanges inf", ["nfv", "gen-trace", "--mean-exchanges", "inf",
                                        "-o", "{prepcap}"]),
    ("gen-trace --size-dist", ["nfv", "gen-trace", "--size-dist", "lognormal", "-o", "{prepcap}"]),
    ("gen-trace --mix", ["nfv", "gen-trace", "--mix", "quic", "-o", "{prepcap}"]),
    ("gen-trace --size-dist zipf:nan", ["nfv", "gen-trace", "--size-dist", "zipf:nan",
                                        "-o", "{prepcap}"]),
    ("gen-trace -o .txt", ["nfv", "gen-trace", "-o", "{dir}/t.txt"]),
    ("gen-trace -o .json", ["nfv", "gen-trace", "-o", "{dir}/t.json"]),
    ("gen-trace -o missing folder", ["nfv", "gen-trace", "-o", "{dir}/no/t.pcap"]),
    ("gen-trace without -o", ["nfv", "gen-trace", "--flows", "10"]),
    ("inspect missing", ["nfv", "inspect", "{dir}/nope.pcap"]),
    ("inspect garbage", ["nfv", "inspect", B["pcap_garbage"]]),
    ("inspect empty", ["nfv", "inspect", B["pcap_empty"]]),
    ("inspect a folder", ["nfv", "inspect", "{dir}"]),
    ("run --batch-size 0", ["nfv", "run", *RUN, "--batch-size", "0", *OUT]),
    ("run --batch-size -3", ["nfv", "run", *RUN, "--batch-size", "-3", *OUT]),
    ("run --workers -1", ["nfv", "run", *RUN, "--workers", "-1", *OUT]),
    ("run --device", ["nfv", "run", *RUN, "--device", "tpu", *OUT]),
    *([] if HAS_CUDA else [("run --device cuda without CUDA", ["nfv", "run", *RUN, "--device",
                                                                "cuda", *OUT])]),
    ("run --engine", ["nfv", "run", *RUN, "--engine", "quantum", *OUT]),
    ("run --engine fixed:2", ["nfv", "run", *RUN, "--engine", "fixed:2", *OUT]),
    ("run config missing", ["nfv", "run", "--config", "{dir}/nope.yaml", "--trace", "{pcap}", *OUT]),
    ("run config is a topology", ["nfv", "run", "--config", "{t}", "--trace", "{pcap}", *OUT]),
    ("run config unknown nf", ["nfv", "run", "--config", B["nf_unknown"], "--trace", "{pcap}",
                               *OUT]),
    ("run trace missing", ["nfv", "run", "--config", "{cfg}", "--trace", "{dir}/nope.pcap", *OUT]),
    ("run trace garbage", ["nfv", "run", "--config", "{cfg}", "--trace", B["pcap_garbage"], *OUT]),
    ("run -o .txt", ["nfv", "run", *RUN, "-o", "{dir}/r.txt"]),
    ("run -o .pcap", ["nfv", "run", *RUN, "-o", "{dir}/r.pcap"]),
    ("bench --engines ''", ["nfv", "bench", *RUN, "--engines", "", *OUT]),
    ("bench --engines ','", ["nfv", "bench", *RUN, "--engines", ",", *OUT]),
    ("bench --engines unknown", ["nfv", "bench", *RUN, "--engines", "cpu,warp", *OUT]),
    ("bench --repeats 0", ["nfv", "bench", *RUN, "--repeats", "0", *OUT]),
    ("bench --batch-size 0", ["nfv", "bench", *RUN, "--batch-size", "0", *OUT]),
    ("bench --workers -1", ["nfv", "bench", *RUN, "--workers", "-1", *OUT]),
    ("bench -o .txt", ["nfv", "bench", *RUN, "-o", "{dir}/b.txt"]),
    ("netstar run --window 0", ["nfv", "netstar", "run", *RUN, "--window", "0", *OUT]),
    ("netstar run --retry-budget-s nan", ["nfv", "netstar", "run", *RUN, "--retry-budget-s", "nan",
                                          *OUT]),
    ("netstar run --style", ["nfv", "netstar", "run", *RUN, "--style", "threads", *OUT]),
    ("netstar run -o .txt", ["nfv", "netstar", "run", *RUN, "-o", "{dir}/n.txt"]),
    ("netstar bench --flows 0", ["nfv", "netstar", "bench", "--config", "{cfg}", "--flows", "0",
                                 *OUT]),
    ("netstar bench --repeats 0", ["nfv", "netstar", "bench", "--config", "{cfg}", "--repeats",
                                   "0", *OUT]),
    ("netstar bench --store-latency-ms nan", ["nfv", "netstar", "bench", "--config", NETSTAR,
                                              "--store-latency-ms", "nan", *OUT]),
    ("netstar bench --store-latency-ms -3", ["nfv", "netstar", "bench", "--config", NETSTAR,
                                             "--store-latency-ms", "-3", *OUT]),
    ("chain without l4_chain", ["nfv", "chain", *RUN, *OUT]),
    ("run an l4_chain config", ["nfv", "run", "--config", L4, "--trace", "{pcap}", *OUT]),
    ("chain --device", ["nfv", "chain", "--config", L4, "--trace", "{pcap}", "--device", "tpu",
                        *OUT]),
    ("chain --batch-size 0", ["nfv", "chain", "--config", L4, "--trace", "{pcap}",
                              "--batch-size", "0", *OUT]),
    ("chain -o .txt", ["nfv", "chain", "--config", L4, "--trace", "{pcap}", "-o", "{dir}/c.txt"]),
    ("learn heterog graph missing", ["plan", "learn", "heterog", "--graphs", "{dir}/nope.json",
                                     "--topologies", "{t}", *OUT]),
    ("learn heterog --search-s nan", ["plan", "learn", "heterog", "--graphs", "{g}",
                                      "--topologies", "{t}", "--search-s", "nan", *OUT]),
    ("learn heterog --episodes 0", ["plan", "learn", "heterog", "--graphs", "{g}",
                                    "--topologies", "{t}", "--episodes", "0", *OUT]),
    ("tag --playouts 0", ["plan", "tag", *PLAN_IO, "--playouts", "0", *OUT]),
    ("learn tag random:x", ["plan", "learn", "tag", "--graphs", "{g}", "--topologies", "random:x",
                            *OUT]),
    ("learn tag --iterations 0", ["plan", "learn", "tag", "--graphs", "{g}", "--topologies", "{t}",
                                  "--iterations", "0", *OUT]),
    ("learn disco a graph for measurements", ["plan", "learn", "disco", "--measurements", "{g}",
                                              *OUT]),
    ("learn disco --epochs 0", ["plan", "learn", "disco", "--measurements", "{g}", "--epochs",
                                "0", *OUT]),
    ("disco --estimator a graph", ["plan", "disco", *PLAN_IO, "--estimator", "{g}", *OUT]),
    ("profile fusion graph missing", ["profile", "fusion", "--graph", "{dir}/nope.json", *OUT]),
    ("profile fusion --samples 0", ["profile", "fusion", "--graph", "{g}", "--samples", "0",
                                    *OUT]),
    ("profile fusion a plan for a graph", ["profile", "fusion", "--graph", "{plan}", *OUT]),
    ("actors up cluster of another kind", ["nfv", "actors", "up", "--cluster", "{cfg}"]),
    ("actors status cluster missing", ["nfv", "actors", "status", "--cluster", "{dir}/no.yaml"]),
    ("actors replay --rate", ["nfv", "actors", "replay", *ACTORS, "--rate", "fast"]),
    ("actors replay --stats .txt", ["nfv", "actors", "replay", *ACTORS, "--stats",
                                    "{dir}/stats.txt"]),
    ("actors migrate same runtime", ["nfv", "actors", "migrate", *ACTORS, "--flows", "5",
                                     "--from", "rt1", "--to", "rt1"]),
    ("actors migrate unknown runtime", ["nfv", "actors", "migrate", *ACTORS, "--flows", "5",
                                        "--from", "rt1", "--to", "rt9"]),
    ("actors fail the switch", ["nfv", "actors", "fail", *ACTORS, "--runtime", "switch"]),
    ("actors bench --sizes 0", ["nfv", "actors", "bench", *ACTORS, "--sizes", "0", *OUT]),
]


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad-inputs")
    files = make_workspace(folder)
    bad = {}
    for name, (suffix, content) in BAD_FILES.items():
        path = folder / f"bad-{name}{suffix}"
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, str):
            path.write_text(content)
        elif suffix == ".json":
            path.write_text(json.dumps(content))  # NaN and Infinity as JSON's extensions
        else:
            path.write_text(yaml.safe_dump(content))
        bad[name] = path
    plan_doc = json.loads(files["plan"].read_text())
    for name, fusion in BAD_FUSIONS.items():
        bad[name] = folder / f"bad-{name}.json"
        bad[name].write_text(json.dumps({**plan_doc, "fusion": fusion}))
    (folder / "sub.json").mkdir()
    return folder, files, bad


def test_the_table_covers_every_command_with_over_120_cases():
    from dl_nfv.cli.reference import iter_commands

    assert len(CASES) >= 120
    names = [name for name, _ in CASES]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)
    leaves = {name.split(" ", 1)[1] for name, command in iter_commands()
              if " " in name and not hasattr(command, "commands")}
    tried = {" ".join(args[:3]) for _, args in CASES} | {" ".join(args[:2]) for _, args in CASES} \
        | {args[0] for _, args in CASES}
    untried = sorted(leaf for leaf in leaves if leaf not in tried)
    assert not untried, f"commands without a bad input: {untried}"


@pytest.mark.parametrize("args", [args for _, args in CASES], ids=[name for name, _ in CASES])
def test_bad_input_is_exit_2_with_one_line_and_nothing_written(workspace, args):
    folder, files, bad = workspace
    pre, prepcap = folder / "pre.json", folder / "pre.pcap"
    pre.write_bytes(b"PRE\n")
    prepcap.write_bytes(b"PRE PCAP\n")
    places = {"g": files["graph"], "t": files["topology"], "plan": files["plan"],
              "pcap": files["pcap"], "cfg": files["config"], "pre": pre, "prepcap": prepcap,
              "dir": folder, **{f"bad_{name}": path for name, path in bad.items()}}
    argv = [a.format_map(places) if "{" in a else a for a in args]
    before = sorted(p.name for p in folder.iterdir())
    result = invoke(argv)
    assert result.exit_code == 2, (argv, result.output)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert result.stdout == ""
    assert pre.read_bytes() == b"PRE\n" and prepcap.read_bytes() == b"PRE PCAP\n"
    assert sorted(p.name for p in folder.iterdir()) == before, "a file was left behind"
