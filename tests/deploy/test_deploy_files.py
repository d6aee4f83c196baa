"""The deployment files: they parse with their own tools and keep the stop-safety rules.

Each file is checked by the tool that will read it in production where that tool is
here (supervisor's parser, ``systemd-analyze verify``, ``promtool``), and always by
plain Python for the rules that matter most: SIGTERM to Celery's main process, a stop
timeout longer than the longest batch, no shell wrapper, and Flower and the console
never open nor off loopback.

A missing tool or a project piece another change has not landed yet skips locally
but fails in CI (``CI=true``), so a green CI run cannot hide either.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import signal
import subprocess
import textwrap
import tomllib
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from digest_cleanup.settings import DEFAULT_VISIBILITY_TIMEOUT
from tests.rig.tools import require, require_tool

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = ROOT / "compose"
SUPERVISOR_CONF = DEPLOY / "supervisor" / "digest-cleanup.conf"
SYSTEMD = DEPLOY / "systemd"
UNITS = (
    "digest-cleanup-worker@.service",
    "digest-cleanup-beat.service",
    "digest-cleanup-flower.service",
    "digest-cleanup-metrics.service",
    "digest-cleanup-console.service",
)
#: The longest batch: a DeleteObjects plus retries capped below half the visibility
#: timeout, so every stop timeout must be longer than the visibility timeout itself.
LONGEST_BATCH_SECONDS = DEFAULT_VISIBILITY_TIMEOUT
#: Every metric the alert rules may use; ``digest-cleanup metrics`` implements these.
KNOWN_METRICS = frozenset(
    {
        "digest_cleanup_oldest_pending_age_seconds",
        "digest_cleanup_dead_letter_depth",
        "digest_cleanup_dead_letter_keys",
        "digest_cleanup_dead_letter_oldest_age_seconds",
        "digest_cleanup_dead_letter_max_entries",
        "digest_cleanup_dead_letter_retention_seconds",
        "digest_cleanup_last_success_timestamp_seconds",
        "digest_cleanup_expired_remaining",
        "digest_cleanup_run_status",
        "digest_cleanup_keys_total",
        "digest_cleanup_duplicate_deliveries_total",
        "digest_cleanup_retries_total",
        "digest_cleanup_redriven_total",
        "digest_cleanup_enqueue_to_ack_seconds",
        "digest_cleanup_key_failures_total",
        "digest_cleanup_max_skipped_share",
        "digest_cleanup_run_expired_keys",
    }
)
#: The only S3 actions the IAM policy may grant.
ALLOWED_ACTIONS = frozenset(
    {
        "s3:ListBucket",
        "s3:ListBucketVersions",
        "s3:GetBucketVersioning",
        "s3:DeleteObject",
        "s3:DeleteObjectVersion",
        "s3:GetObjectLegalHold",
        "s3:GetObjectRetention",
        "s3:PutObject",
        "s3:GetObject",
        "s3:AbortMultipartUpload",
    }
)
#: Where the conditions probe writes, under each target prefix (``kinds.s3_probe``).
PROBE_ARNS = frozenset(
    f"arn:aws:s3:::digest-artifacts/{prefix}/.digest-cleanup-check-*"
    for prefix in ("statements", "tmp", "receipts")
)


def missing(reason: str) -> None:
    """Skip locally, fail in CI: a project piece that nothing installs is not here yet."""
    require(False, reason, install=None)


def check_celery_argv(argv: list[str]) -> str:
    """Parse ``celery -A digest_cleanup SUB ...`` with Celery's own click commands.

    Returns the subcommand.  Unknown options (a typo such as ``--loglvel``) fail here
    rather than at 3 a.m.; Flower's options are Tornado's and are checked against them.
    """
    from celery import Celery
    from celery.bin.base import CLIContext
    from celery.bin.celery import celery as celery_cli

    assert Path(argv[0]).name == "celery", argv
    assert argv[1:3] == ["-A", "digest_cleanup"], f"not the project's app: {argv}"
    sub = argv[3]
    assert sub in celery_cli.commands, f"celery has no subcommand {sub!r}"
    obj = CLIContext(
        app=Celery("deploy-check", set_as_current=False), no_color=True, workdir=None, quiet=True
    )
    try:
        ctx = celery_cli.commands[sub].make_context(sub, list(argv[4:]), obj=obj)
    except click.UsageError as exc:
        pytest.fail(f"celery {sub} rejects {argv[4:]}: {exc}")
    if sub == "flower":
        import flower.options  # noqa: F401 - defines Flower's Tornado options
        from tornado.options import options as tornado_options

        for arg in ctx.params["tornado_argv"]:
            name = arg.lstrip("-").partition("=")[0]
            if name not in tornado_options:
                pytest.fail(f"Flower has no option --{name}")
    return sub


def check_cli_argv(argv: list[str]) -> None:
    """``digest-cleanup SUB ...`` is a declared script and the real parser accepts it."""
    assert Path(argv[0]).name == "digest-cleanup", argv
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("digest-cleanup") == "digest_cleanup.cli:main"
    if find_spec("digest_cleanup.cli") is None:
        missing("digest_cleanup.cli does not exist yet")
    from digest_cleanup.cli import build_parser

    try:
        build_parser().parse_args(argv[1:])
    except SystemExit:
        missing(f"the CLI does not accept {shlex.join(argv[1:])!r} yet")


def check_module_argv(argv: list[str]) -> None:
    """``python -m digest_cleanup.X ...`` names a module of the package."""
    assert argv[:2] == ["python", "-m"], argv
    module = argv[2]
    assert module.startswith("digest_cleanup."), f"not the project's module: {module}"
    if find_spec(module) is None:
        missing(f"{module} does not exist yet")


def check_entry_point(argv: list[str]) -> None:
    """Every process the deployment files start is one of the project's entry points."""
    name = Path(argv[0]).name
    if name == "celery":
        check_celery_argv(argv)
    elif name == "digest-cleanup":
        check_cli_argv(argv)
    elif name == "python":
        check_module_argv(argv)
    else:
        pytest.fail(f"{argv[0]} is not celery, digest-cleanup or python -m: {argv}")


def test_argv_checker_rejects_typos() -> None:
    """Given a misspelt option, when the checker parses it, then it fails (the checks bite)."""
    with pytest.raises(pytest.fail.Exception, match="loglvel"):
        check_celery_argv(["celery", "-A", "digest_cleanup", "worker", "--loglvel=INFO"])
    with pytest.raises(pytest.fail.Exception, match="addres"):
        check_celery_argv(["celery", "-A", "digest_cleanup", "flower", "--addres=0.0.0.0"])


@pytest.fixture
def supervisor_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The variables supervisord would have from the env file and the drop-in."""
    values = {
        "DIGEST_CLEANUP_HOME": str(tmp_path / "venv"),
        "DIGEST_CLEANUP_STATE_DIR": str(tmp_path / "state"),
        "DIGEST_CLEANUP_USER": pwd.getpwuid(os.getuid()).pw_name,
        "FLOWER_BASIC_AUTH": 'ops:s3"cr%t',
        "CLEANUP_CONSOLE_AUTH": "admin:c0ns%le-s3cret",
        "CLEANUP_BROKER_URL": "redis://127.0.0.1:6379/0",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def _supervisor_main_conf(tmp_path: Path) -> Path:
    """A throwaway main config that includes the real file, as a supervisord test would."""
    main = tmp_path / "supervisord.conf"
    main.write_text(
        textwrap.dedent(
            f"""\
            [unix_http_server]
            file={tmp_path}/supervisor.sock
            [supervisord]
            logfile={tmp_path}/supervisord.log
            pidfile={tmp_path}/supervisord.pid
            childlogdir={tmp_path}
            [rpcinterface:supervisor]
            supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
            [supervisorctl]
            serverurl=unix://{tmp_path}/supervisor.sock
            [include]
            files={SUPERVISOR_CONF}
            """
        )
    )
    return main


def _supervisor_programs(tmp_path: Path) -> dict[str, Any]:
    from supervisor.options import ServerOptions

    options = ServerOptions()  # reads os.environ for %(ENV_...)s now
    options.configfile = str(_supervisor_main_conf(tmp_path))
    options.process_config(do_usage=False)
    assert not options.parse_warnings, options.parse_warnings
    assert not options.parse_criticals, options.parse_criticals
    return {
        process.name: process
        for group in options.process_group_configs
        for process in group.process_configs
    }


def test_supervisor_file_parses_with_supervisors_own_parser(
    tmp_path: Path, supervisor_env: dict[str, str]
) -> None:
    """Given the env placeholders, when supervisor parses the file, then all five programs load."""
    programs = _supervisor_programs(tmp_path)

    assert set(programs) == {
        "digest-cleanup-worker-1",
        "digest-cleanup-beat",
        "digest-cleanup-flower",
        "digest-cleanup-metrics",
        "digest-cleanup-console",
    }


def test_supervisor_group_lists_every_program(
    tmp_path: Path, supervisor_env: dict[str, str]
) -> None:
    """``supervisorctl restart digest-cleanup:*`` reaches every program, the console too."""
    from supervisor.options import ServerOptions

    options = ServerOptions()
    options.configfile = str(_supervisor_main_conf(tmp_path))
    options.process_config(do_usage=False)
    groups = {group.name: group for group in options.process_group_configs}

    assert set(groups) == {"digest-cleanup"}, "a program outside the group misses restarts"
    names = {p.name for p in groups["digest-cleanup"].process_configs}
    assert names == set(_supervisor_programs(tmp_path))


def test_supervisor_programs_stop_warmly(tmp_path: Path, supervisor_env: dict[str, str]) -> None:
    programs = _supervisor_programs(tmp_path)

    for name, process in programs.items():
        assert process.stopsignal == signal.SIGTERM, name
        assert process.stopwaitsecs > LONGEST_BATCH_SECONDS, name
        assert process.killasgroup is True, name
        assert process.directory == supervisor_env["DIGEST_CLEANUP_STATE_DIR"], name
    # The worker alone keeps SIGTERM off its pool children (they would die mid-batch).
    assert programs["digest-cleanup-worker-1"].stopasgroup is False
    for name in (
        "digest-cleanup-beat",
        "digest-cleanup-flower",
        "digest-cleanup-metrics",
        "digest-cleanup-console",
    ):
        assert programs[name].stopasgroup is True, name


@pytest.mark.parametrize(
    "program",
    [
        "digest-cleanup-worker-1",
        "digest-cleanup-beat",
        "digest-cleanup-flower",
        "digest-cleanup-metrics",
        "digest-cleanup-console",
    ],
)
def test_supervisor_program_execs_an_entry_point_directly(
    tmp_path: Path, supervisor_env: dict[str, str], program: str
) -> None:
    argv = shlex.split(_supervisor_programs(tmp_path)[program].command)
    home = supervisor_env["DIGEST_CLEANUP_HOME"]

    # No shell wrapper: the configured binary itself is what supervisord execs.
    assert argv[0] in (f"{home}/bin/celery", f"{home}/bin/digest-cleanup")
    check_entry_point(argv)


def test_supervisor_runs_one_beat_with_its_schedule_in_the_state_dir(
    tmp_path: Path, supervisor_env: dict[str, str]
) -> None:
    programs = _supervisor_programs(tmp_path)
    beats = [p for p in programs.values() if " beat " in f" {p.command} "]

    assert [p.name for p in beats] == ["digest-cleanup-beat"]
    state = supervisor_env["DIGEST_CLEANUP_STATE_DIR"]
    assert f"--schedule={state}/celerybeat-schedule" in shlex.split(beats[0].command)


def test_supervisor_passes_secrets_by_inheritance_not_in_the_file(
    tmp_path: Path, supervisor_env: dict[str, str]
) -> None:
    """Secrets reach the programs through supervisord's environment, never argv or environment=."""
    programs = _supervisor_programs(tmp_path)

    for process in programs.values():
        for secret in (supervisor_env["FLOWER_BASIC_AUTH"], supervisor_env["CLEANUP_CONSOLE_AUTH"]):
            assert secret not in process.command
            assert secret not in (process.environment or {}).values()
        assert "basic-auth" not in process.command
    assert programs["digest-cleanup-flower"].environment == {"FLOWER_UNAUTHENTICATED_API": "false"}
    # The console reads CLEANUP_CONSOLE_AUTH from the inherited environment, nothing else.
    assert not programs["digest-cleanup-console"].environment


def test_supervisor_loads_the_file_without_console_auth(
    tmp_path: Path, supervisor_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given no CLEANUP_CONSOLE_AUTH, the file still loads: the console refuses on its own.

    Unlike Flower, which starts open, so the file demands FLOWER_BASIC_AUTH; demanding
    the console's variable too would keep the workers from loading for want of it.
    """
    monkeypatch.delenv("CLEANUP_CONSOLE_AUTH")

    assert "digest-cleanup-console" in _supervisor_programs(tmp_path)


def test_supervisor_refuses_the_file_without_flower_basic_auth(
    tmp_path: Path, supervisor_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given no FLOWER_BASIC_AUTH, when supervisord loads the file, then it refuses, naming it."""
    monkeypatch.delenv("FLOWER_BASIC_AUTH")

    with pytest.raises(ValueError, match="ENV_FLOWER_BASIC_AUTH"):
        _supervisor_programs(tmp_path)


def test_supervisor_refuses_the_file_without_its_path_placeholders(
    tmp_path: Path, supervisor_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DIGEST_CLEANUP_HOME")

    with pytest.raises(ValueError, match="ENV_DIGEST_CLEANUP_HOME"):
        _supervisor_programs(tmp_path)


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values in order]}}; systemd allows repeated keys."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}: keep each setting on one line"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not key=value: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def systemd_seconds(value: str) -> float:
    """Seconds in a systemd time span such as ``360``, ``6min`` or ``5min 30s``."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit]
    return total


#: What systemd puts for the specifiers the units use, as it would for instance 1.
SPECIFIERS = {"%i": "1", "%H": "host.example", "%S": "/var/lib", "%%": "%"}


def expand_specifiers(arg: str) -> str:
    """An argument as systemd hands it over (Celery would reject a raw ``%H``)."""
    return re.sub(r"%.", lambda m: SPECIFIERS[m.group()], arg)


def one(service: dict[str, list[str]], key: str) -> str:
    values = service.get(key, [])
    assert len(values) == 1, f"{key}= should be set exactly once, got {values}"
    return values[0]


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_unit_has_the_required_settings(unit: str) -> None:
    service = parse_unit(SYSTEMD / unit)["Service"]

    assert one(service, "Type") == "exec"
    assert one(service, "KillSignal") == "SIGTERM"
    # mixed: SIGTERM to the main process only, SIGKILL to the group after the timeout.
    assert one(service, "KillMode") == "mixed"
    assert systemd_seconds(one(service, "TimeoutStopSec")) > LONGEST_BATCH_SECONDS
    assert one(service, "Restart") == "on-failure"
    assert one(service, "EnvironmentFile") == "/etc/digest-cleanup/env"
    assert one(service, "User") == "digest-cleanup"
    assert one(service, "Group") == "digest-cleanup"
    for key, expected in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
    }.items():
        assert one(service, key) == expected, key
    # Python's ctypes/cffi callbacks need W+X pages; the unit says so in a comment instead.
    assert "MemoryDenyWriteExecute" not in service


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_unit_execs_a_project_entry_point_directly(unit: str) -> None:
    service = parse_unit(SYSTEMD / unit)["Service"]
    argv = shlex.split(one(service, "ExecStart"))

    # No shell wrapper and no systemd prefix (-, @, +, !): the binary itself is the main process.
    assert argv[0] in ("/opt/digest-cleanup/bin/celery", "/opt/digest-cleanup/bin/digest-cleanup")
    check_entry_point([expand_specifiers(arg) for arg in argv])


def test_systemd_worker_is_a_template_named_after_its_instance() -> None:
    service = parse_unit(SYSTEMD / "digest-cleanup-worker@.service")["Service"]
    argv = shlex.split(one(service, "ExecStart"))

    assert argv[3] == "worker"
    assert argv[argv.index("-n") + 1] == "worker%i@%H"


def test_systemd_beat_keeps_its_schedule_in_the_state_directory() -> None:
    service = parse_unit(SYSTEMD / "digest-cleanup-beat.service")["Service"]
    argv = shlex.split(one(service, "ExecStart"))

    assert one(service, "StateDirectory") == "digest-cleanup"
    # %S is /var/lib for system units, the parent of StateDirectory=.
    assert "--schedule=%S/digest-cleanup/celerybeat-schedule" in argv


def _precheck_script(unit: str = "digest-cleanup-flower.service") -> str:
    service = parse_unit(SYSTEMD / unit)["Service"]
    argv = shlex.split(one(service, "ExecStartPre"))
    assert argv[:2] == ["/bin/sh", "-c"], argv
    # systemd turns $$ into $ before sh sees the script.
    return argv[2].replace("$$", "$")


@pytest.mark.parametrize(
    ("value", "starts"),
    [
        (None, False),
        ("", False),
        ("ops", False),
        ("ops:", False),
        ("ops:a,b", False),
        ("ops:s3cret", True),
        ("ops:with:colon", True),
    ],
)
def test_systemd_flower_refuses_to_start_without_basic_auth(
    value: str | None, starts: bool
) -> None:
    """Given FLOWER_BASIC_AUTH=value, when ExecStartPre runs, then only user:pass starts Flower."""
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    if value is not None:
        env["FLOWER_BASIC_AUTH"] = value

    result = subprocess.run(
        ["/bin/sh", "-c", _precheck_script()], env=env, capture_output=True, check=False
    )

    assert (result.returncode == 0) is starts, result.stderr
    if value:
        assert value.encode() not in result.stderr, "the check must not echo the secret"


@pytest.mark.parametrize(
    ("value", "starts"),
    [
        (None, False),
        ("", False),
        ("admin", False),
        ("admin:", False),
        (":pw", False),
        ("admin:s3cret", True),
        ("admin:with:colon", True),
    ],
)
def test_systemd_console_refuses_to_start_without_auth(value: str | None, starts: bool) -> None:
    """Given CLEANUP_CONSOLE_AUTH=value, when ExecStartPre runs, then only user:password starts.

    The console refuses on its own too; this check only makes the refusal plain in
    ``systemctl status``, so it tests presence and leaves the exact format to the console.
    """
    env = {k: v for k, v in os.environ.items() if k != "CLEANUP_CONSOLE_AUTH"}
    if value is not None:
        env["CLEANUP_CONSOLE_AUTH"] = value
    script = _precheck_script("digest-cleanup-console.service")

    result = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, check=False)

    assert (result.returncode == 0) is starts, result.stderr
    if not starts:
        assert b"CLEANUP_CONSOLE_AUTH=user:password" in result.stderr, "say how to set it"
    if value:
        assert value.encode() not in result.stderr, "the check must not echo the secret"


@pytest.fixture
def verifiable_units(tmp_path: Path) -> Path:
    """Copies of the units whose binaries exist here (verify checks that they do)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("celery", "digest-cleanup"):
        stub = bin_dir / name
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
    units = tmp_path / "units"
    units.mkdir()
    for unit in UNITS:
        text = (SYSTEMD / unit).read_text().replace("/opt/digest-cleanup/bin/", f"{bin_dir}/")
        (units / unit).write_text(text)
    return units


@pytest.mark.parametrize(
    "unit",
    [
        "digest-cleanup-worker@1.service",
        "digest-cleanup-beat.service",
        "digest-cleanup-flower.service",
        "digest-cleanup-metrics.service",
        "digest-cleanup-console.service",
    ],
)
def test_systemd_analyze_verify_finds_nothing(verifiable_units: Path, unit: str) -> None:
    """systemd-analyze verify accepts each unit (the worker through an instance of its template).

    verify only warns, with exit 0, on unknown keys and bad values, so any line it
    prints about our unit fails the test.  It does not check that User= exists,
    so the missing digest-cleanup user here is no reason to filter anything.
    """
    tool = require_tool("systemd-analyze")

    result = subprocess.run(
        [tool, "verify", "--man=no", str(verifiable_units / unit)],
        capture_output=True,
        text=True,
        check=False,
    )

    output = (result.stdout + result.stderr).splitlines()
    stem = unit.split("@")[0]
    ours = [line for line in output if stem in line]
    assert result.returncode == 0, "\n".join(output)
    assert not ours, "\n".join(ours)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((COMPOSE / "compose.yaml").read_text())
    return data


def compose_seconds(value: str) -> float:
    """Seconds in a compose duration such as ``6m``, ``360s`` or ``1m30s``."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", value)
    assert "".join(n + u for n, u in parts) == value, f"not a compose duration: {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


APP_SERVICES = ("worker", "beat", "flower", "metrics", "console", "seed")


def test_compose_has_every_service(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"redis", "s3", *APP_SERVICES}


def test_compose_worker_can_scale(compose: dict[str, Any]) -> None:
    """--scale worker=3 needs a generated container name and no fixed host port."""
    worker = compose["services"]["worker"]

    assert "container_name" not in worker
    assert "ports" not in worker


@pytest.mark.parametrize("name", APP_SERVICES)
def test_compose_app_services_exec_an_entry_point(compose: dict[str, Any], name: str) -> None:
    service = compose["services"][name]

    # A list is exec form: no /bin/sh -c between docker and the process.
    assert isinstance(service["command"], list), f"{name}: use the exec (list) form"
    assert service["build"]["dockerfile"] == "compose/Dockerfile"
    # tini forwards SIGTERM to the main process only and reaps orphans.
    assert service["init"] is True
    assert service["stop_signal"] == "SIGTERM"
    assert compose_seconds(service["stop_grace_period"]) > LONGEST_BATCH_SECONDS
    check_entry_point(service["command"])


def test_compose_runs_one_beat_with_persistent_schedule(compose: dict[str, Any]) -> None:
    beat = compose["services"]["beat"]

    assert "--schedule=/var/lib/digest-cleanup/celerybeat-schedule" in beat["command"]
    assert any(v.startswith("beat-state:/var/lib/digest-cleanup") for v in beat["volumes"])
    assert "deploy" not in beat, "beat must not be replicated"


def test_flower_listens_on_loopback_only_in_every_deployment(compose: dict[str, Any]) -> None:
    service = parse_unit(SYSTEMD / "digest-cleanup-flower.service")["Service"]
    supervised = (DEPLOY / "supervisor" / "digest-cleanup.conf").read_text()
    flower_line = next(
        line for line in supervised.splitlines() if line.startswith("command=") and "flower" in line
    )

    assert "--address=127.0.0.1" in service["ExecStart"][0]
    assert "--address=127.0.0.1" in flower_line
    assert compose["services"]["flower"]["ports"] == ["127.0.0.1:${FLOWER_PORT:-5555}:5555"]


def test_console_listens_on_loopback_only_in_every_deployment(compose: dict[str, Any]) -> None:
    """The console can redrive and purge: every file binds it to loopback, one instance."""
    expected = ["console", "--host", "127.0.0.1", "--port", "8642"]
    service = parse_unit(SYSTEMD / "digest-cleanup-console.service")["Service"]
    supervised = [
        line
        for line in SUPERVISOR_CONF.read_text().splitlines()
        if line.startswith("command=") and " console " in line
    ]

    assert shlex.split(one(service, "ExecStart"))[1:] == expected
    assert len(supervised) == 1, supervised
    assert shlex.split(supervised[0])[1:] == expected
    console = compose["services"]["console"]
    # Inside the container it must listen beyond loopback for the port to be published;
    # the host publishes it on loopback only.
    assert console["command"] == ["digest-cleanup", *expected[:2], "0.0.0.0", *expected[3:]]
    assert console["ports"] == ["127.0.0.1:${CONSOLE_PORT:-8642}:8642"]
    assert "deploy" not in console, "one console: nothing replicates it"
    section = SUPERVISOR_CONF.read_text().split("[program:digest-cleanup-console]")[1]
    assert not re.search(r"^numprocs=(?!1$)", section, re.M), "one console"


def test_compose_console_requires_auth(compose: dict[str, Any]) -> None:
    console = compose["services"]["console"]
    env = console["environment"]

    assert re.fullmatch(r"\$\{CLEANUP_CONSOLE_AUTH:\?[^}]+\}", env["CLEANUP_CONSOLE_AUTH"])
    # Viewers are optional: unset, the console has no read-only users.
    assert env["CLEANUP_CONSOLE_VIEWERS"] == "${CLEANUP_CONSOLE_VIEWERS:-}"
    assert not any("CONSOLE_AUTH" in arg for arg in console["command"]), "secret in argv"
    # The same settings as every other process, plus the console's own.
    assert set(compose["x-app"]["environment"]) <= set(env)


def test_compose_flower_requires_basic_auth(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    env = flower["environment"]

    assert re.fullmatch(r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", env["FLOWER_BASIC_AUTH"])
    assert env["FLOWER_UNAUTHENTICATED_API"] == "false"
    assert not any("basic-auth" in arg for arg in flower["command"]), "secret would be in argv"


def test_compose_env_names_only_known_settings(compose: dict[str, Any]) -> None:
    known = {
        "CLEANUP_BROKER_URL",
        "CLEANUP_S3_ENDPOINT_URL",
        "CLEANUP_TARGETS_FILE",
        "CLEANUP_VISIBILITY_TIMEOUT",
        "CLEANUP_AUDIT_URL",
        "CLEANUP_LOG_FORMAT",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
        "FLOWER_BASIC_AUTH",
        "FLOWER_UNAUTHENTICATED_API",
        "CLEANUP_CONSOLE_AUTH",
        "CLEANUP_CONSOLE_VIEWERS",
        "CLEANUP_CONSOLE_URL",
    }
    for name in APP_SERVICES:
        assert set(compose["services"][name]["environment"]) <= known, name


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("redis", "redis-cli ping"),
        ("s3", "http://127.0.0.1:8333/healthz"),
        ("worker", "inspect ping"),
        ("flower", "http://127.0.0.1:5555/healthcheck"),
        ("metrics", "http://127.0.0.1:9808/metrics"),
    ],
)
def test_compose_health_checks(compose: dict[str, Any], name: str, needle: str) -> None:
    test = compose["services"][name]["healthcheck"]["test"]

    assert test[0] in ("CMD", "CMD-SHELL")
    assert needle in " ".join(test[1:])


def test_compose_worker_health_check_is_a_valid_celery_command(compose: dict[str, Any]) -> None:
    kind, script = compose["services"]["worker"]["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    # $$ is compose's escape for a literal $, which the container's shell expands.
    argv = shlex.split(script.replace("$$HOSTNAME", "host"))

    assert check_celery_argv(argv) == "inspect"
    assert argv[argv.index("-d") + 1] == "worker@host"
    command = compose["services"]["worker"]["command"]
    assert command[command.index("-n") + 1] == "worker@%h", "the ping must name the worker's node"


def test_compose_waits_for_healthy_dependencies(compose: dict[str, Any]) -> None:
    services = compose["services"]

    assert services["worker"]["depends_on"] == {
        "redis": {"condition": "service_healthy"},
        "s3": {"condition": "service_healthy"},
    }
    for name in ("beat", "flower", "metrics", "console"):
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}, name
    assert services["seed"]["depends_on"]["s3"] == {"condition": "service_healthy"}
    assert services["seed"]["profiles"] == ["demo"]


def test_compose_targets_file_is_valid_and_mounted(compose: dict[str, Any]) -> None:
    from digest_cleanup.targets import load_targets

    targets = load_targets(COMPOSE / "targets.toml")

    assert {t.name for t in targets} == {"statements", "tmp", "receipts"}
    worker = compose["services"]["worker"]
    assert "./targets.toml:/etc/digest-cleanup/targets.toml:ro" in worker["volumes"]
    assert worker["environment"]["CLEANUP_TARGETS_FILE"] == "/etc/digest-cleanup/targets.toml"


def test_dockerfile_builds_the_project_as_a_non_root_user() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    assert re.findall(r"^FROM (\S+)", text, re.M) == ["python:3.11-slim", "python:3.11-slim"]
    assert "pip install '.[metrics,ui]'" in text
    assert {"metrics", "ui"} <= set(extras)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user, "the image must switch to its own user"
    assert user[-1].split(":")[0] not in ("root", "0")
    assert re.search(r"^STOPSIGNAL SIGTERM$", text, re.M)


def test_dockerfile_copies_only_files_that_exist() -> None:
    text = (COMPOSE / "Dockerfile").read_text()
    sources = [
        src
        for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M)
        for src in line.split()[:-1]
    ]

    assert sources, "the Dockerfile copies nothing from the context"
    absent = [src for src in sources if not (ROOT / src).exists()]
    if absent:
        missing(f"the build context lacks {absent} (pyproject.toml names README.md as readme)")


@pytest.fixture(scope="module")
def policy_statements() -> list[dict[str, Any]]:
    policy = json.loads((DEPLOY / "iam-policy.json").read_text())
    assert policy["Version"] == "2012-10-17"
    statements: list[dict[str, Any]] = policy["Statement"]
    return statements


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _granted(statements: list[dict[str, Any]]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for statement in statements:
        for action in _as_list(statement["Action"]):
            for resource in _as_list(statement["Resource"]):
                yield action, resource, statement.get("Condition", {})


def test_iam_policy_grants_only_the_allowed_actions(
    policy_statements: list[dict[str, Any]],
) -> None:
    granted = {action for action, _, _ in _granted(policy_statements)}

    assert granted == ALLOWED_ACTIONS
    for statement in policy_statements:
        assert statement["Effect"] == "Allow"
        assert "NotAction" not in statement
        assert "NotResource" not in statement


def test_iam_policy_restricts_every_resource_to_the_targets(
    policy_statements: list[dict[str, Any]],
) -> None:
    from digest_cleanup.targets import load_targets

    targets = list(load_targets(COMPOSE / "targets.toml"))
    buckets = {t.options.bucket for t in targets}
    object_arns = {f"arn:aws:s3:::{t.options.bucket}/{t.options.prefix}*" for t in targets}
    list_prefixes = {f"{t.options.prefix}*" for t in targets}

    from digest_cleanup.kinds.s3_probe import probe_prefix

    probes = {f"arn:aws:s3:::{t.options.bucket}/{probe_prefix(t.options)}*" for t in targets}
    assert probes == PROBE_ARNS
    for action, resource, condition in _granted(policy_statements):
        if resource in PROBE_ARNS:
            # Reading, deleting and listing the probe come with the target prefix.
            assert action in ("s3:PutObject", "s3:AbortMultipartUpload")
        elif action == "s3:PutObject":
            assert resource == "arn:aws:s3:::digest-audit/reports/*"
        elif action in ("s3:ListBucket", "s3:ListBucketVersions"):
            assert resource in {f"arn:aws:s3:::{b}" for b in buckets}
            assert set(condition["StringLike"]["s3:prefix"]) == list_prefixes
        elif action == "s3:GetBucketVersioning":
            assert resource in {f"arn:aws:s3:::{b}" for b in buckets}
        else:
            assert resource in object_arns, f"{action} on {resource}"
    deletable = {r for a, r, _ in _granted(policy_statements) if a == "s3:DeleteObject"}
    assert deletable == object_arns, "every target prefix (the probe's among them), no more"
    readable = {r for a, r, _ in _granted(policy_statements) if a == "s3:GetObject"}
    assert readable == object_arns, "ETag conditions need s3:GetObject"


def test_iam_policy_covers_the_audit_url_the_stack_uses(
    compose: dict[str, Any], policy_statements: list[dict[str, Any]]
) -> None:
    setting = compose["x-app"]["environment"]["CLEANUP_AUDIT_URL"]
    match = re.fullmatch(r"\$\{CLEANUP_AUDIT_URL:-s3://([^/]+)/(.*)\}", setting)
    assert match, setting
    bucket, prefix = match.groups()

    writable = {r for a, r, _ in _granted(policy_statements) if a == "s3:PutObject"}
    assert writable == {f"arn:aws:s3:::{bucket}/{prefix}*", *PROBE_ARNS}


ALERTS = DEPLOY / "prometheus" / "alerts.yml"


@pytest.fixture(scope="module")
def rules() -> dict[str, dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text())
    found = {rule["alert"]: rule for group in data["groups"] for rule in group["rules"]}
    assert len(found) == sum(len(g["rules"]) for g in data["groups"]), "duplicate alert names"
    return found


def test_every_alert_rule_is_complete(rules: dict[str, dict[str, Any]]) -> None:
    for name, rule in rules.items():
        assert rule["expr"].strip(), name
        assert re.fullmatch(r"\d+[smh]", rule["for"]), f"{name}: for: {rule.get('for')!r}"
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert len(rule["annotations"]["reason"]) > 20, f"{name}: say why the threshold"
        assert rule["annotations"]["summary"], name
        used = set(re.findall(r"\bdigest_cleanup_[a-z_]+", rule["expr"]))
        used = {re.sub(r"_(bucket|sum|count)$", "", m) for m in used}
        assert used <= KNOWN_METRICS, f"{name}: unknown metrics {used - KNOWN_METRICS}"


def test_the_required_alerts_exist(rules: dict[str, dict[str, Any]]) -> None:
    slo = rules["DigestCleanupPendingOverBudget"]
    assert "digest_cleanup_oldest_pending_age_seconds" in slo["expr"]
    assert "2 * 3600" in slo["expr"]
    assert (slo["for"], slo["labels"]["severity"]) == ("10m", "page")
    dead = rules["DigestCleanupDeadLetters"]
    assert (dead["for"], dead["labels"]["severity"]) == ("15m", "ticket")
    assert "8 * 86400" in rules["DigestCleanupNoRecentSuccess"]["expr"]
    assert "digest_cleanup_expired_remaining" in rules["DigestCleanupExpiredRemaining"]["expr"]
    assert 'status="failed"' in rules["DigestCleanupRunFailed"]["expr"]
    assert "rate(digest_cleanup_retries_total" in rules["DigestCleanupRetryStorm"]["expr"]
    endpoint = rules["DigestCleanupEndpointAnswersNotS3"]["expr"]
    assert "condition_mismatch" in endpoint
    assert "not_found_unconfirmed" in endpoint
    assert "digest_cleanup_max_skipped_share" in rules["DigestCleanupSkippedShareHigh"]["expr"]


def test_promtool_check_rules() -> None:
    promtool = require_tool("promtool")

    result = subprocess.run(
        [promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stdout + result.stderr


#: promtool unit tests: each alert fires when it should and not a minute earlier.
#: They run against a copy without annotations, which promtool would otherwise
#: compare verbatim; ``promtool check rules`` has already parsed the templates.
PROMTOOL_TESTS = """\
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Crosses the 2 h budget at minute 5 (6960 + 5*60 = 7260 > 7200).
      - series: 'digest_cleanup_oldest_pending_age_seconds{target="statements"}'
        values: '6960+60x60'
      - series: 'digest_cleanup_oldest_pending_age_seconds{target="tmp"}'
        values: '0x60'
      - series: 'digest_cleanup_dead_letter_depth'
        values: '0 0 0 0 0 2x60'
      # promtool's clock starts at 0: -691000 is 8 days minus 200 s before it.
      - series: 'digest_cleanup_last_success_timestamp_seconds{target="statements"}'
        values: '-691000x60'
      - series: 'digest_cleanup_last_success_timestamp_seconds{target="tmp"}'
        values: '0x60'
      - series: 'digest_cleanup_expired_remaining{target="statements"}'
        values: '5x60'
      - series: 'digest_cleanup_expired_remaining{target="tmp"}'
        values: '0x60'
      - series: 'digest_cleanup_run_status{target="statements",status="running"}'
        values: '1x9 0x50'
      - series: 'digest_cleanup_run_status{target="receipts",status="failed"}'
        values: '0 0 1x60'
      - series: 'digest_cleanup_retries_total{target="statements",code="SlowDown"}'
        values: '0+60x60'
      - series: 'digest_cleanup_retries_total{target="statements",code="InternalError"}'
        values: '0+10x60'
      - series: 'digest_cleanup_duplicate_deliveries_total{target="statements"}'
        values: '0+1x60'
      - series: 'digest_cleanup_duplicate_deliveries_total{target="tmp"}'
        values: '0+1x5 5x55'
    alert_rule_test:
      - {eval_time: 14m, alertname: DigestCleanupPendingOverBudget, exp_alerts: []}
      - eval_time: 16m
        alertname: DigestCleanupPendingOverBudget
        exp_alerts: [{exp_labels: {severity: page, target: statements}}]
      - {eval_time: 19m, alertname: DigestCleanupDeadLetters, exp_alerts: []}
      - eval_time: 21m
        alertname: DigestCleanupDeadLetters
        exp_alerts: [{exp_labels: {severity: ticket}}]
      - {eval_time: 33m, alertname: DigestCleanupNoRecentSuccess, exp_alerts: []}
      - eval_time: 35m
        alertname: DigestCleanupNoRecentSuccess
        exp_alerts: [{exp_labels: {severity: ticket, target: statements}}]
      - {eval_time: 39m, alertname: DigestCleanupExpiredRemaining, exp_alerts: []}
      - eval_time: 41m
        alertname: DigestCleanupExpiredRemaining
        exp_alerts: [{exp_labels: {severity: ticket, target: statements}}]
      - {eval_time: 31m, alertname: DigestCleanupRunFailed, exp_alerts: []}
      - eval_time: 33m
        alertname: DigestCleanupRunFailed
        exp_alerts: [{exp_labels: {severity: ticket, target: receipts}}]
      - {eval_time: 14m, alertname: DigestCleanupRetryStorm, exp_alerts: []}
      - eval_time: 18m
        alertname: DigestCleanupRetryStorm
        exp_alerts: [{exp_labels: {severity: ticket, target: statements, code: SlowDown}}]
      - eval_time: 59m
        alertname: DigestCleanupDuplicateDeliveries
        exp_alerts: [{exp_labels: {severity: ticket, target: statements}}]
      - {eval_time: 59m, alertname: DigestCleanupMetricsAbsent, exp_alerts: []}
  - interval: 1m
    input_series:
      # The queue reaches its bound at minute 2; the oldest entry passes its retention then.
      - series: 'digest_cleanup_dead_letter_depth'
        values: '50 50 100x60'
      - series: 'digest_cleanup_dead_letter_max_entries'
        values: '100x60'
      - series: 'digest_cleanup_dead_letter_oldest_age_seconds'
        values: '0 0 2419300+60x60'
      - series: 'digest_cleanup_dead_letter_retention_seconds'
        values: '2419200x60'
    alert_rule_test:
      - {eval_time: 6m, alertname: DigestCleanupDeadLetterQueueFull, exp_alerts: []}
      - eval_time: 8m
        alertname: DigestCleanupDeadLetterQueueFull
        exp_alerts: [{exp_labels: {severity: page}}]
      - {eval_time: 16m, alertname: DigestCleanupDeadLetterPastRetention, exp_alerts: []}
      - eval_time: 18m
        alertname: DigestCleanupDeadLetterPastRetention
        exp_alerts: [{exp_labels: {severity: ticket}}]
  - interval: 1m
    input_series:
      - series: 'digest_cleanup_keys_total{target="statements",outcome="deleted"}'
        values: '0x30'
    alert_rule_test:
      - {eval_time: 14m, alertname: DigestCleanupMetricsAbsent, exp_alerts: []}
      - eval_time: 16m
        alertname: DigestCleanupMetricsAbsent
        exp_alerts: [{exp_labels: {severity: ticket}}]
  - interval: 1m
    input_series:
      # statements: 10 condition_mismatch keys from minute 2, and 30 of 200 expired keys
      # skipped from minute 3 (0.15 > its 0.1); receipts: 100 SlowDown failures, and 30
      # of 200 skipped within its allowance of 0.2.
      - series: 'digest_cleanup_key_failures_total{target="statements",code="condition_mismatch"}'
        values: '0 0 10x60'
      - series: 'digest_cleanup_key_failures_total{target="receipts",code="SlowDown"}'
        values: '100x60'
      - series: 'digest_cleanup_keys_total{target="statements",outcome="skipped"}'
        values: '0 0 0 30x60'
      - series: 'digest_cleanup_keys_total{target="receipts",outcome="skipped"}'
        values: '30x60'
      - series: 'digest_cleanup_run_expired_keys{target="statements"}'
        values: '200x60'
      - series: 'digest_cleanup_run_expired_keys{target="receipts"}'
        values: '200x60'
      - series: 'digest_cleanup_max_skipped_share{target="statements"}'
        values: '0.1x60'
      - series: 'digest_cleanup_max_skipped_share{target="receipts"}'
        values: '0.2x60'
    alert_rule_test:
      - {eval_time: 6m, alertname: DigestCleanupEndpointAnswersNotS3, exp_alerts: []}
      - eval_time: 8m
        alertname: DigestCleanupEndpointAnswersNotS3
        exp_alerts: [{exp_labels: {severity: ticket, target: statements, code: condition_mismatch}}]
      - {eval_time: 17m, alertname: DigestCleanupSkippedShareHigh, exp_alerts: []}
      - eval_time: 19m
        alertname: DigestCleanupSkippedShareHigh
        exp_alerts: [{exp_labels: {severity: ticket, target: statements}}]
"""


def test_promtool_unit_tests_fire_each_alert_on_time(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    data = yaml.safe_load(ALERTS.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    bare = tmp_path / "alerts.yml"
    bare.write_text(yaml.safe_dump(data))
    tests = tmp_path / "alerts_test.yml"
    tests.write_text(f"rule_files: [{json.dumps(str(bare))}]\n" + PROMTOOL_TESTS)

    result = subprocess.run(
        [promtool, "test", "rules", str(tests)], capture_output=True, text=True, check=False
    )

    assert result.returncode == 0, result.stdout + result.stderr


DEPLOYMENT_FILES = sorted([*DEPLOY.rglob("*"), *COMPOSE.rglob("*")], key=lambda p: str(p))


@pytest.mark.parametrize(
    "path", [p for p in DEPLOYMENT_FILES if p.is_file()], ids=lambda p: str(p.relative_to(ROOT))
)
def test_no_file_names_a_path_of_the_build_machine(path: Path) -> None:
    text = path.read_text()

    assert not re.search(r"(?<![\w.-])/(work|root)(/|\b)", text), (
        "use conventional paths such as /opt/digest-cleanup, /etc/digest-cleanup, "
        "/var/lib/digest-cleanup"
    )
