"""Where every command's output goes (cli/options.py; docs/user-guide.md, "Conventions"), and
that `dl-nfv show` renders every file the commands write.

Off a terminal (as here): stderr is empty on success; ``-o`` alone leaves stdout empty;
``--json`` puts exactly one JSON document on stdout; with neither, the result is on stdout
(an artifact later commands read as its JSON document, anything else as tables, never cut
to 80 columns).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import EXAMPLES, ROOT

from .workspace import invoke, make_workspace

PIPEDREAM = ROOT / "tests" / "data" / "profile_pipedream_graph.txt"
PLACEMENT = ROOT / "tests" / "data" / "profile_placement.json"
PLAN_IO = ["--graph", "{g}", "--topology", "{t}"]
RUN = ["--config", "{cfg}", "--trace", "{pcap}"]

# name, arguments, suffix of its -o file, what it prints when asked for no file and no JSON:
# "document" (the artifact as JSON), "tables", or None (it has no such mode)
RESULTS = [
    ("plan dp", ["plan", "dp", *PLAN_IO], ".json", "document"),
    ("plan pipeline", ["plan", "pipeline", *PLAN_IO, "--time-limit", "2"], ".yaml", "document"),
    ("plan compare", ["plan", "compare", *PLAN_IO, "--planners", "dp,single"], ".json", "tables"),
    ("simulate", ["simulate", "{plan}"], ".json", "tables"),
    ("nfv run", ["nfv", "run", *RUN, "--engine", "gpu"], ".json", "tables"),
    ("nfv bench", ["nfv", "bench", *RUN, "--engines", "gpu"], ".json", "tables"),
    ("profile model", ["profile", "model", "mlp-tiny", "--repeats", "1", "--span", "0", "--no-batch-scaling"],
     ".json", "document"),
    ("profile import pipedream", ["profile", "import", "pipedream", str(PIPEDREAM)], ".json",
     "document"),
    ("profile import placement-json", ["profile", "import", "placement-json", str(PLACEMENT)],
     ".json", "document"),
    ("nfv gen-trace", ["nfv", "gen-trace", "--flows", "20"], ".pcap", None),
]
VIEWS = [
    ("plan list", ["plan", "list"]),
    ("profile devices", ["profile", "devices"]),
    ("profile models", ["profile", "models"]),
    ("nfv inspect", ["nfv", "inspect", "{pcap}"]),
    ("show", ["show", "{plan}"]),
]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    folder = tmp_path_factory.mktemp("output-rule")
    files = make_workspace(folder)
    return {"g": files["graph"], "t": files["topology"], "plan": files["plan"],
            "pcap": files["pcap"], "cfg": files["config"], "dir": folder}


def _run(args, places):
    result = invoke([a.format_map(places) if "{" in a else a for a in args])
    assert result.exit_code == 0, result.output
    assert result.stderr == "", f"stderr is not a terminal, yet: {result.stderr!r}"
    return result


def _uncut(text: str) -> None:
    assert "…" not in text, "a table was cut to fit a width"


@pytest.mark.parametrize("name,args,suffix,asked_nowhere", RESULTS, ids=[r[0] for r in RESULTS])
def test_a_result_goes_where_its_options_say(places, name, args, suffix, asked_nowhere):
    out = places["dir"] / f"{name.replace(' ', '-')}{suffix}"
    written = _run([*args, "-o", str(out)], places)
    assert written.stdout == "" and out.stat().st_size > 0
    both = _run([*args, "-o", str(places["dir"] / f"again{suffix}"), "--json"], places)
    json.loads(both.stdout)
    if asked_nowhere is None:
        return
    bare = _run(args, places)
    if asked_nowhere == "document":
        assert json.loads(bare.stdout)["kind"]
    else:
        assert bare.stdout.strip() and not bare.stdout.lstrip().startswith("{")
        _uncut(bare.stdout)


@pytest.mark.parametrize("name,args", VIEWS, ids=[v[0] for v in VIEWS])
def test_a_listing_prints_its_view_or_json_on_stdout(places, name, args):
    view = _run(args, places)
    assert view.stdout.strip()
    _uncut(view.stdout)
    json.loads(_run([*args, "--json"], places).stdout)


def test_show_renders_every_file_the_commands_write(places):
    d = places["dir"]
    made = {
        "plan.yaml": ["plan", "dp", *PLAN_IO, "-o", "{dir}/plan.yaml"],
        "cmp.json": ["plan", "compare", *PLAN_IO, "--planners", "dp,single", "-o",
                     "{dir}/cmp.json"],
        "sim.json": ["simulate", "{plan}", "-o", "{dir}/sim.json", "--trace", "{dir}/trace.json"],
        "report.json": ["nfv", "run", *RUN, "--engine", "gpu", "-o", "{dir}/report.json"],
        "bench.yaml": ["nfv", "bench", *RUN, "--engines", "gpu", "-o", "{dir}/bench.yaml"],
        "pd.json": ["profile", "import", "pipedream", str(PIPEDREAM), "-o", "{dir}/pd.json"],
    }
    for args in made.values():
        _run(args, places)
    kinds = {}
    for name in [*made, "trace.json"]:
        shown = _run(["show", str(d / name)], places)
        assert shown.stdout.strip()
        _uncut(shown.stdout)
        kinds[name] = json.loads(_run(["show", str(d / name), "--json"], places).stdout)
    assert kinds["cmp.json"]["kind"] == "plan-comparison"
    assert kinds["bench.yaml"]["kind"] == "nfv-bench"
    assert kinds["trace.json"]["events"] > 0


def test_a_wide_table_is_whole_in_a_log():
    """Off a terminal, the 8-GPU bandwidth matrix comes out whole, however wide."""
    result = invoke(["show", EXAMPLES / "topologies" / "heterog-testbed8.yaml"])
    assert result.exit_code == 0 and "bandwidth between devices" in result.stdout
    _uncut(result.stdout)
    assert max(len(line) for line in result.stdout.splitlines()) > 80


def test_the_commands_that_start_workers_or_write_folders_follow_it_too(places):
    """train and profile network (worker processes) once each with -o and --json together;
    plan export (a folder). Their files render with show."""
    d = places["dir"]
    run = _run(["train", "{plan}", "--steps", "2", "--threads", "1", "-o", "{dir}/run.json",
                "--json"], places)
    assert json.loads(run.stdout)["kind"] == "run-report"
    probe = _run(["profile", "network", "--nprocs", "2", "--max-bytes", "4096", "--repeats", "1",
                  "--warmup", "0", "--threads", "1", "-o", "{dir}/net.yaml", "--report",
                  "{dir}/probe.json", "--json"], places)
    assert json.loads(probe.stdout)["kind"] == "topology"
    _run(["plan", "gpipe", *PLAN_IO, "--stages", "2", "-o", "{dir}/pipe.json"], places)
    export = _run(["plan", "export", "{dir}/pipe.json", "-o", "{dir}/export"], places)
    assert export.stdout == "" and (d / "export" / "schedule.csv").exists()
    for name in ("run.json", "net.yaml", "probe.json", "pipe.json"):
        assert _run(["show", str(d / name)], places).stdout.strip()
