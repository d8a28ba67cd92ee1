"""Starting and stopping a cluster's switch and runtimes as local OS processes.

Every process ``ClusterProcesses`` starts is put in one new process group, so that
``stop`` (and any failure while starting) ends all of them with one ``killpg``. Each
process also exits by itself when the process that started it is gone. ``start``
waits until every runtime has answered the switch's heartbeat; a process that exits
first (a port in use, a bad file) or a runtime that never answers is ``BadInput``
naming it, after everything started has been stopped. ``restart_dead`` restarts the
runtimes that died once the switch has taken over from them (``nfv actors up`` does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dl_nfv.artifacts.errors import BadInput

from .cluster import ClusterSpec, is_local
from .wire import Endpoint

START_TIMEOUT_S = 30.0


class ClusterProcesses:
    """The switch and runtimes of the cluster file ``path``, started here."""

    def __init__(self, path: str | Path, spec: ClusterSpec) -> None:
        self.path = str(path)
        self.spec = spec
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}
        self.group: int | None = None
        self.folder = tempfile.TemporaryDirectory(prefix="dl-nfv-actors-")

    def __enter__(self) -> ClusterProcesses:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout_s: float = START_TIMEOUT_S) -> dict:
        """Start every process and wait for every runtime to join; the switch's status."""
        for member in (self.spec.switch, *self.spec.runtimes):
            if not is_local(member):
                raise BadInput(f"runtime {member.name!r} listens on {member.address}, which is "
                               f"not this machine: start it there")
        try:
            self._spawn(self.spec.switch.name, [self.path])
            for runtime in self.spec.runtimes:
                self._spawn(runtime.name, [self.path, runtime.name], module="runtime")
            return self._wait_joined(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, args: list[str], module: str = "switch") -> None:
        log = self.logs[name] = Path(self.folder.name) / f"{name}.err"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", f"dl_nfv.nfv.actors.{module}", *args],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                process_group=0 if self.group is None else self.group)
        if self.group is None:
            self.group = proc.pid
        self.procs[name] = proc

    def _exited(self) -> str | None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                lines = self.logs[name].read_text(errors="replace").strip().splitlines()
                why = lines[-1] if lines else f"exit status {proc.returncode}"
                return f"{name} exited while starting: {why}"
        return None

    def _wait_joined(self, timeout_s: float) -> dict:
        endpoint = Endpoint(f"starter-{os.getpid()}")
        try:
            deadline = time.monotonic() + timeout_s
            status: dict = {}
            while time.monotonic() < deadline:
                if (problem := self._exited()) is not None:
                    raise BadInput(problem)
                endpoint.send(self.spec.switch.endpoint, "hello", endpoint.address)
                for kind, _, payload in endpoint.receive(0.2):
                    if kind == "hello":
                        status = payload
                runtimes = status.get("runtimes", {})
                if runtimes and all(r["joined"] for r in runtimes.values()):
                    return status
            missing = [n for n, r in status.get("runtimes", {}).items() if not r["joined"]]
            raise BadInput(f"runtime {', '.join(missing) or self.spec.switch.name} did not "
                           f"answer within {timeout_s:g} s (unreachable)")
        finally:
            endpoint.close()

    def restart_dead(self, status: dict) -> list[str]:
        """Restart each runtime whose process exited and that the switch (``status``) has
        declared dead and finished taking over from, as a cluster manager would: the new
        process joins empty and is used from the next load. The names restarted."""
        restarted = []
        for name, view in status["runtimes"].items():
            proc = self.procs.get(name)
            if proc is None or proc.poll() is None or view["live"] or view["standby"]:
                continue
            events = [e for e in status["events"] if e.get("runtime") == name]
            if events and events[-1]["takeover_ms"] is not None:
                self._spawn(name, [self.path, name], module="runtime")
                restarted.append(name)
        return restarted

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def stop(self) -> None:
        """End every process started here (the whole process group) and reap them."""
        if self.group is not None:
            try:
                os.killpg(self.group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.group = None
        self.folder.cleanup()
