"""Start `python -m nanoserve serve` as a subprocess on a free loopback port, and stop it; and
where a server runs: loopback hosts, free ports, the CPUs it is pinned to.

Tests, lesson 10 and benchmarks/http_peers.py run the real server this way: a separate process,
as a user runs it, reached over a real socket. `ServerProcess` waits for GET /health with a
timeout (failing with the server's own log if it dies or never becomes healthy), and `stop()`
sends SIGTERM, waits, and kills only if the server did not exit in time. It is a context manager
and also registers itself with atexit (and, on Linux, asks the kernel to SIGTERM the server if
its parent dies), so a notebook or a test run never leaves a server behind.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def parse_cpus(spec: str) -> list[int]:
    """'0-3' or '0,2' or '1' -> sorted CPU numbers (ValueError naming the spec if malformed)."""
    cpus = set()
    try:
        for part in spec.split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ValueError(f"--cpu-omp-threads-bind {spec!r}: expected CPUs like 0, 0-3 or 0,2") from None
    if not cpus or min(cpus) < 0:
        raise ValueError(f"--cpu-omp-threads-bind {spec!r}: expected CPUs like 0, 0-3 or 0,2")
    return sorted(cpus)


def bind_cpus(spec: str | None) -> None:
    """Run on these CPUs: as many torch threads, and the affinity (Linux) that later threads inherit."""
    if not spec:
        return
    import torch
    cpus = parse_cpus(spec)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free now (another process could still take it before we bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on the port now: bind with SO_REUSEADDR, as uvicorn does
    (connections the old server closed may still linger in TIME_WAIT; they don't block a server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _die_with_parent() -> None:
    """Linux: the kernel sends the server SIGTERM if the process that started it dies (a killed
    notebook kernel or test run), where atexit cannot run."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ServerProcess:
    """`nanoserve serve MODEL *args` on host:port (default: a free loopback port); another server
    module with `entry` (the router: ("nanoserve.serve.router",)).

    env: extra environment variables (e.g. OMP_NUM_THREADS); startup_timeout: seconds to wait
    for /health. The server's output goes to a temporary log file (`log()` reads it).
    """

    health_path = "/health"  # a subclass running another server names that server's readiness route

    def __init__(self, model: str | None = None, *args: str, host: str = "127.0.0.1",
                 port: int | None = None, env: dict | None = None, startup_timeout: float = 180.0,
                 entry: tuple[str, ...] = ("nanoserve", "serve")):
        self.model, self.args, self.host = model, [str(a) for a in args], host
        self.entry = entry  # `python -m ENTRY...`: the server, or ("nanoserve.serve.router",)
        self.port = port or free_port(host)
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile("w+", prefix="nanoserve-serve-", suffix=".log",
                                                delete=False)
        self._final_log: str | None = None  # the log once stopped (the file is then removed)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        model = [self.model] if self.model else []
        return [sys.executable, "-m", *self.entry, *model, "--host", self.host,
                "--port", str(self.port), *self.args]

    def start(self) -> ServerProcess:
        """Launch, then wait for /health (stopping the server if it never gets there)."""
        self.launch()
        try:
            self.wait_healthy(self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> ServerProcess:
        """Start the process without waiting (several servers can then load at once)."""
        self.proc = subprocess.Popen(self.command, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=self.env, preexec_fn=_die_with_parent)
        atexit.register(self.stop)
        return self

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.base_url + self.health_path, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"no healthy server at {self.base_url} after {timeout:g} s:\n{self.log()}")

    @property
    def log_path(self) -> str:
        return self._log.name

    def log(self, tail: int = 4000) -> str:
        if self._final_log is not None:
            return self._final_log[-tail:]
        with open(self._log.name) as f:
            return f.read()[-tail:]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, wait up to `timeout` s, then SIGKILL. -> the exit code."""
        atexit.unregister(self.stop)
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._final_log is None:
            self._final_log = self.log(tail=10**6)
            self._log.close()
            os.unlink(self._log.name)
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
