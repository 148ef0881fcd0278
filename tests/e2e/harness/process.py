"""Control-plane processes: started with their output in a log file, stopped terminate-then-kill."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

#: ports handed out by this process, never handed out twice (a component may bind its port late)
_handed: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago, chosen below the
    kernel's ephemeral range: a port from that range can be taken by any process's outgoing
    connection between the check and the component's bind; one below it only by an explicit bind."""
    low, _ = _ephemeral_range()
    first = 10000 if low > 12000 else 1024
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(first, low)
        if port in _handed:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed.add(port)
        ports.append(port)
    return ports


def free_port() -> int:
    return free_ports(1)[0]


class Component:
    """One running binary. ``log`` holds its stdout and stderr."""

    def __init__(self, name: str, argv: list[str], log: Path, cwd: Path):
        self.name, self.argv, self.log = name, argv, log
        (log.parent / f"{log.stem}.cmdline").write_text(" \\\n  ".join(argv) + "\n")
        self._log_file = open(log, "ab")
        self.proc = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll ``probe`` until it is true; fail early, with the log tail, if the process exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log {self.log}:\n"
                                   f"{self.tail()}")
            try:
                if probe():
                    return
            except Exception:  # not up yet: connection refused, TLS, 500 from /readyz ...
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s; log {self.log}:\n{self.tail()}")

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log_file.close()
