"""An output named by a device or a pipe (``-o /dev/null``, ``-o >(cmd)``) takes the result
as it is (cli/options.py ``check_output_path``, artifacts/io.py ``write_text_atomic``): the
command succeeds, stdout stays empty, the device is still a device, and what a pipe reads
is the document a regular file of the same name's format gets (JSON without an extension).
"""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest
import yaml

from dl_nfv.artifacts.io import special_file, write_text_atomic
from tests.conftest import EXAMPLES

from .workspace import invoke, make_workspace

DEV_NULL = "/dev/null"
L4 = str(EXAMPLES / "nf" / "fw-nat-lb.yaml")
PLAN_IO = ["--graph", "{g}", "--topology", "{t}"]

# every kind of writer: an artifact through deliver, a second artifact option, a trace
# through write_text_atomic, a pcap through the pcap writer, nfv chain's -w check
DISCARDED = [
    ("plan dp", ["plan", "dp", *PLAN_IO, "-o", DEV_NULL]),
    ("simulate -o --trace", ["simulate", "{plan}", "-o", DEV_NULL, "--trace", DEV_NULL]),
    ("nfv gen-trace", ["nfv", "gen-trace", "--flows", "20", "-o", DEV_NULL]),
    ("nfv chain -o -w", ["nfv", "chain", "--config", L4, "--trace", "{pcap}", "--engine", "cpu",
                         "-o", DEV_NULL, "-w", DEV_NULL]),
]

needs_dev_null = pytest.mark.skipif(not os.path.exists(DEV_NULL) or not special_file(DEV_NULL),
                                    reason="no /dev/null character device")


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    folder = tmp_path_factory.mktemp("special-outputs")
    files = make_workspace(folder)
    return {"g": files["graph"], "t": files["topology"], "plan": files["plan"],
            "pcap": files["pcap"], "dir": folder}


def _argv(args, places):
    return [a.format_map(places) if "{" in a else a for a in args]


def _read_fifo(path) -> tuple[threading.Thread, list[bytes]]:
    """A reader on FIFO ``path`` (a writer's open blocks until one is there)."""
    got: list[bytes] = []

    def read():
        with open(path, "rb") as fh:
            got.append(fh.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got


def _finish(reader: threading.Thread, fifo) -> None:
    """Wait for the reader; if nothing opened the pipe to write, open and close it so the
    reader sees an empty stream instead of waiting for ever."""
    reader.join(timeout=2)
    if reader.is_alive():
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # the reader left meanwhile
            pass
    reader.join(timeout=10)


@needs_dev_null
@pytest.mark.parametrize("name,args", DISCARDED, ids=[d[0] for d in DISCARDED])
def test_dev_null_takes_any_commands_output(places, name, args):
    before = sorted(p.name for p in places["dir"].iterdir())
    result = invoke(_argv(args, places))
    assert result.exit_code == 0, result.output
    assert result.stdout == "" and result.stderr == ""
    assert stat.S_ISCHR(os.stat(DEV_NULL).st_mode), "/dev/null was replaced"
    assert sorted(p.name for p in places["dir"].iterdir()) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
@pytest.mark.parametrize("fifo_name,regular_name", [("plan-pipe", "plan.json"),
                                                     ("plan-pipe.yaml", "plan.yaml")])
def test_a_pipe_gets_what_a_file_of_its_format_gets(places, fifo_name, regular_name):
    fifo = places["dir"] / fifo_name
    os.mkfifo(fifo)
    regular = places["dir"] / regular_name
    args = ["plan", "dp", *PLAN_IO]
    assert invoke(_argv([*args, "-o", str(regular)], places)).exit_code == 0
    reader, got = _read_fifo(fifo)
    result = invoke(_argv([*args, "-o", str(fifo)], places))
    _finish(reader, fifo)
    assert result.exit_code == 0, result.output
    assert len(got) == 1
    piped, filed = yaml.safe_load(got[0]), yaml.safe_load(regular.read_bytes())
    piped.pop("wall_time_s"), filed.pop("wall_time_s")
    assert piped == filed and piped["kind"] == "plan"
    if fifo_name.endswith(".yaml"):
        assert got[0].startswith(b"kind: plan\n")
    else:
        assert json.loads(got[0])["kind"] == "plan"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the pipe was renamed over"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_the_writer_writes_through_a_pipe_and_renames_over_a_file(tmp_path):
    fifo, regular = tmp_path / "out", tmp_path / "out.json"
    os.mkfifo(fifo)
    reader, got = _read_fifo(fifo)
    write_text_atomic(fifo, "through\n")
    _finish(reader, fifo)
    assert got == [b"through\n"] and special_file(fifo)
    regular.write_text("old\n")
    inode = regular.stat().st_ino
    write_text_atomic(regular, "new\n")
    assert regular.read_text() == "new\n" and not special_file(regular)
    assert regular.stat().st_ino != inode, "a regular file is replaced by rename, not rewritten"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.json"]


def test_a_regular_path_without_a_known_extension_is_still_refused(places):
    out = places["dir"] / "plan-out"
    result = invoke(_argv(["plan", "dp", *PLAN_IO, "-o", str(out)], places))
    assert result.exit_code == 2 and "extension" in result.stderr
    assert not out.exists()
