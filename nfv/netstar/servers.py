"""Real servers on loopback for tests and benchmarks: redis-server, dnsmasq, a latency proxy.

``start_redis`` runs ``redis-server`` (Debian's package) on a free loopback
port in a folder of its own, optionally with an append-only file fsynced on
every write (so that a restart after ``kill -9`` has every acknowledged
write). ``start_dnsmasq`` runs ``dnsmasq`` (Debian's ``dnsmasq-base``) on a
free loopback port, answering only from a hosts file (A records) and TXT
records the caller gives, NXDOMAIN for every other name (no upstream).
``start_proxy`` runs ``proxy.py`` in a process of its own: a TCP proxy that
adds a fixed delay to every byte sent to the server. Every server binds
127.0.0.1 only; ``stop`` ends it, ``kill`` ends it without warning.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from dl_nfv.artifacts.errors import RuntimeFailure

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP and UDP port free on loopback now."""
    while True:
        with socket.socket() as tcp:
            tcp.bind((LOOPBACK, 0))
            port = tcp.getsockname()[1]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            try:
                udp.bind((LOOPBACK, port))
            except OSError:
                continue
        return port


def binary(name: str) -> str | None:
    """Path of ``name`` on PATH or in the sbin folders (dnsmasq lives in /usr/sbin)."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")


@dataclass
class Server:
    """A server process on a loopback port."""

    name: str
    port: int
    args: list
    folder: Path
    proc: subprocess.Popen | None = None
    log: Path = field(default=None)

    def start(self, ready) -> Server:
        self.log = self.folder / f"{self.name}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=self.folder, start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeFailure(f"{self.name} exited at start: "
                                     f"{self.log.read_text(errors='replace')[-400:]}")
            if ready():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeFailure(f"{self.name} did not start on {LOOPBACK}:{self.port} within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """End at once (SIGKILL), as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def pause(self) -> None:
        """Stop answering (SIGSTOP) without closing anything."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)


def _tcp_ready(port: int):
    def ready() -> bool:
        try:
            with socket.create_connection((LOOPBACK, port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    return ready


class RedisServer(Server):
    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}"

    def restart(self) -> RedisServer:
        """Start again on the same port and folder (replaying its append-only file)."""
        self.stop()
        return self.start(_tcp_ready(self.port))


def start_redis(folder: str | Path, *, port: int | None = None,
                durable: bool = False) -> RedisServer:
    """``redis-server`` on ``127.0.0.1:port`` (a free one by default), data in ``folder``.
    ``durable``: append-only file fsynced on every write."""
    exe = binary("redis-server")
    if exe is None:
        raise RuntimeFailure("redis-server is not installed (apt-get install redis-server)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [exe, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--dir", str(folder),
            "--protected-mode", "yes", "--daemonize", "no"]
    if durable:
        args += ["--appendonly", "yes", "--appendfsync", "always"]
    return RedisServer("redis-server", port, args, folder).start(_tcp_ready(port))


class DnsServer(Server):
    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"


def _dns_ready(port: int):
    def ready() -> bool:
        import dns.exception
        import dns.message
        import dns.query

        try:
            dns.query.udp(dns.message.make_query("ready.invalid.", "A"), LOOPBACK, port=port,
                          timeout=0.2)
            return True
        except (dns.exception.DNSException, OSError):
            return False

    return ready


def start_dnsmasq(folder: str | Path, *, hosts: dict[str, list[str]] | None = None,
                  txt: dict[str, str] | None = None, port: int | None = None) -> DnsServer:
    """``dnsmasq`` on ``127.0.0.1:port`` answering ``hosts`` (name -> IPv4 addresses) and
    ``txt`` (name -> text) and NXDOMAIN for any other name."""
    exe = binary("dnsmasq")
    if exe is None:
        raise RuntimeFailure("dnsmasq is not installed (apt-get install dnsmasq-base)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    hosts_file = folder / "hosts"
    hosts_file.write_text("".join(f"{a} {name}\n" for name, addrs in (hosts or {}).items()
                                  for a in addrs))
    lines = [f"port={port}", f"listen-address={LOOPBACK}", "bind-interfaces", "no-resolv",
             "no-hosts", "local=/#/", f"addn-hosts={hosts_file}", "cache-size=0", "pid-file="]
    if os.geteuid() == 0:  # keep root's access to the (private) folder instead of "nobody"
        lines.append("user=root")
    for name, text in (txt or {}).items():
        if '"' in text or "\n" in text:
            raise ValueError(f"TXT text for {name} must not hold quotes or newlines")
        lines.append(f'txt-record={name},"{text}"')
    conf = folder / "dnsmasq.conf"
    conf.write_text("\n".join(lines) + "\n")
    args = [exe, f"--conf-file={conf}", "--keep-in-foreground", "--log-facility=-"]
    return DnsServer("dnsmasq", port, args, folder).start(_dns_ready(port))


@contextlib.contextmanager
def start_proxy(target_port: int, delay_ms: float):
    """A loopback TCP proxy to ``target_port`` adding ``delay_ms`` to the request path;
    yields its port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dl_nfv.nfv.netstar.proxy", str(port),
                             str(target_port), str(delay_ms)], start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((LOOPBACK, port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeFailure(f"latency proxy did not start on port {port}") from None
                time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        proc.wait()
