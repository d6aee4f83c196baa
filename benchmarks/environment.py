"""The machine a benchmark runs on, and what its processes cost.

Every figure in the report is a ratio against a baseline measured in the same
run, because the machine may be shared: the load average at the start and end
of a run says how noisy it was.  Process figures come from ``/proc`` (CPU
seconds, current and peak resident memory), so no extra dependency is needed.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from digest_cleanup.testing.servers import find_redis_server, find_weed

#: Clock ticks per second, the unit of CPU times in ``/proc/PID/stat``.
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Machine:
    """What the numbers were measured on."""

    cores: int
    memory_gib: float
    cpu: str
    kernel: str
    python: str
    weed: str
    redis: str
    packages: Mapping[str, str]

    @classmethod
    def describe(cls) -> Machine:
        """Read the machine and the versions of everything the benchmark drives."""
        packages = {}
        for name in ("celery", "kombu", "redis", "boto3", "botocore", "awscli"):
            try:
                packages[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                packages[name] = "not installed"
        return cls(
            cores=os.cpu_count() or 1,
            memory_gib=_meminfo_kib("MemTotal") / 2**20,
            cpu=_cpu_model(),
            kernel=platform.release(),
            python=platform.python_version(),
            weed=_version_line([str(find_weed() or "weed"), "version"]),
            redis=_version_line([str(find_redis_server() or "redis-server"), "--version"]),
            packages=packages,
        )


def load_average() -> float:
    """The one-minute load average: above the core count, other work shared the machine."""
    return os.getloadavg()[0]


def _meminfo_kib(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _version_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as exc:
        return f"unknown ({exc.strerror})"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of one process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def memory_kib(pid: int) -> tuple[int, int]:
    """(current, peak) resident set size of one process in KiB; (0, 0) once it is gone.

    The peak is the kernel's high-water mark (``VmHWM``), so it catches a spike
    between two polls.
    """
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    values = {}
    for line in status.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


def children(pid: int) -> list[int]:
    """Direct children of a process (a Celery worker's pool processes)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid:
            found.append(int(entry.name))
    return sorted(found)


def tree_cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds of processes and their children together."""
    return sum(cpu_seconds(p) + sum(cpu_seconds(c) for c in children(p)) for p in pids)


def client_ports(server_port: int) -> set[int]:
    """Local ports of established IPv4 connections to ``server_port`` on this machine.

    Sampled through a run, the number of distinct ports is the number of
    connections clients opened: with connection reuse it stays at the number of
    concurrent requests, however many requests were made.
    """
    ports: set[int] = set()
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return ports
    for line in lines:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01" and int(remote.rpartition(":")[2], 16) == server_port:
            ports.add(int(local.rpartition(":")[2], 16))
    return ports
