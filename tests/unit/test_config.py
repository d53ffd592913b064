"""The config file: where it is found, what it accepts, how it refuses, and that the docs agree."""

from __future__ import annotations

import json
import os
import re
import tomllib
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from slurm_recovery import config
from slurm_recovery.config import (
    CONFIG_ENV_VAR,
    DEFAULTS,
    KEYS,
    SECTIONS,
    URL_ENV_VAR,
    AuthConfig,
    ClientConfig,
    ClusterConfig,
    Config,
    ConfigError,
    ControllerConfig,
    HooksConfig,
    LogConfig,
    SchedulerConfig,
    SidecarConfig,
    StoreConfig,
    WatchdogConfig,
    config_from_dict,
    config_from_toml,
    format_duration,
    load_config,
    parse_duration,
    resolve_config_path,
    split_host_port,
)
from slurm_recovery.contract.durations import UNIT_MS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "etc" / "config.toml"
DOCS = REPO / "docs" / "configuration.md"


def write(folder: Path, text: str, name: str = "config.toml") -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(0o644)
    return path


@pytest.fixture
def no_default_file(tmp_path, monkeypatch):
    """Point the default location at a file that does not exist."""
    missing = tmp_path / "etc-absent" / "config.toml"
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", missing)
    return missing


def problems(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return list(excinfo.value.problems)


# --------------------------------------------------------------------------------- finding


def test_missing_default_file_means_all_defaults(no_default_file):
    assert load_config(env={}) == Config()
    assert load_config(env={}).source is None


def test_default_file_is_read_when_nothing_else_is_named(tmp_path, monkeypatch):
    default = write(tmp_path, '[log]\nlevel = "debug"\n')
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", default)
    loaded = load_config(env={})
    assert loaded.log.level == "debug"
    assert loaded.source == default


def test_precedence_explicit_path_over_env_over_default(tmp_path, monkeypatch):
    default = write(tmp_path, '[log]\nlevel = "error"\n', "default.toml")
    from_env = write(tmp_path, '[log]\nlevel = "warning"\n', "env.toml")
    explicit = write(tmp_path, '[log]\nlevel = "debug"\n', "explicit.toml")
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", default)
    env = {CONFIG_ENV_VAR: str(from_env)}

    assert load_config(explicit, env=env).log.level == "debug"
    assert load_config(str(explicit), env=env).source == explicit
    assert load_config(None, env=env).log.level == "warning"
    assert load_config(None, env={}).log.level == "error"
    assert load_config(None, env={CONFIG_ENV_VAR: ""}).log.level == "error"


def test_env_defaults_to_the_process_environment(tmp_path, monkeypatch):
    from_env = write(tmp_path, '[log]\nlevel = "warning"\n')
    monkeypatch.setenv(CONFIG_ENV_VAR, str(from_env))
    assert load_config().log.level == "warning"


def test_resolve_config_path_says_what_named_the_file(tmp_path, no_default_file):
    assert resolve_config_path(tmp_path / "a.toml", {CONFIG_ENV_VAR: "/x"}) == (
        tmp_path / "a.toml",
        "--config",
    )
    assert resolve_config_path(None, {CONFIG_ENV_VAR: "/x"}) == (Path("/x"), "$SRECOVERY_CONFIG")
    assert resolve_config_path("", {}) == (no_default_file, None)


def test_missing_explicit_file_is_an_error(tmp_path, no_default_file):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as excinfo:
        load_config(missing, env={})
    assert str(excinfo.value).startswith(f"{missing}: no such file (named by --config)")


def test_missing_file_named_by_env_is_an_error(tmp_path, no_default_file):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=r"no such file \(named by \$SRECOVERY_CONFIG\)") as ei:
        load_config(env={CONFIG_ENV_VAR: str(missing)})
    assert str(missing) in str(ei.value)


def test_a_directory_is_not_a_config_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, env={})


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_names_the_file(tmp_path):
    path = write(tmp_path, "")
    path.chmod(0o000)
    with pytest.raises(ConfigError, match="permission denied"):
        load_config(path, env={})


# --------------------------------------------------------------------------------- permissions


def test_world_writable_file_is_refused(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "debug"\n')
    path.chmod(0o666)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    message = str(excinfo.value)
    assert message.startswith(f"{path}: world-writable (mode 0666)")
    assert f"chmod o-w {path}" in message


def test_group_writable_file_is_accepted(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "debug"\n')
    path.chmod(0o664)
    assert load_config(path, env={}).log.level == "debug"


def test_file_in_world_writable_directory_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    path = write(folder, "")
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match=rf"directory {re.escape(str(folder))} is world-writable"):
        load_config(path, env={})


def test_sticky_world_writable_directory_is_accepted(tmp_path):
    folder = tmp_path / "sticky"
    folder.mkdir()
    path = write(folder, "")
    folder.chmod(0o1777)
    assert load_config(path, env={}) == Config(source=path)


def test_world_writable_target_of_a_symlink_is_refused(tmp_path):
    target = write(tmp_path, "", "real.toml")
    target.chmod(0o646)
    link = tmp_path / "link.toml"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="world-writable"):
        load_config(link, env={})


# --------------------------------------------------------------------------------- values


def test_every_key_set(tmp_path):
    path = write(
        tmp_path,
        """
[cluster]
name = "GPU-A"

[scheduler]
backend = "scontrol"
command_timeout = "1m30s"
slurm_bin_dir = "/opt/slurm/bin"
slurm_conf = "/opt/slurm/etc/slurm.conf"

[store]
path = "/srv/srecovery/state.db"

[log]
level = "WARNING"

[controller]
listen = "[::1]:8000"
policy = "/srv/srecovery/policy.toml"
loop_interval = "500ms"
hold_deadline = "5m"
max_request_bytes = 4096
spool_dir = "/srv/srecovery/controller"

[auth]
munge_socket = "/run/munge/other.socket"
max_age = "30s"
operator_group = "hpc-admin"
slurm_user = "slurmsvc"

[watchdog]
interval = 20
spool_dir = "/srv/srecovery/watchdog"

[client]
url = "https://head1.example.org:8000/"

[sidecar]
node = "gpu017"
gpu_backend = "SIM"
sim_dir = "/srv/srecovery/sim"
sim_gpus = 4
expected_gpus = 4
poll_interval = "30s"
fast_interval = "50ms"
spool_dir = "/srv/srecovery/spool/{node}"
queue_max_events = 1000
kmsg = false
ib_sysfs = ""
nvml_timeout = 2
batch_max_events = 1

[hooks]
health_gate = true
controller_timeout = "2s"
""",
    )
    assert load_config(path, env={}) == Config(
        cluster=ClusterConfig(name="gpu-a"),
        scheduler=SchedulerConfig(
            backend="scontrol",
            command_timeout=90.0,
            slurm_bin_dir="/opt/slurm/bin",
            slurm_conf="/opt/slurm/etc/slurm.conf",
        ),
        store=StoreConfig(path=Path("/srv/srecovery/state.db")),
        log=LogConfig(level="warning"),
        controller=ControllerConfig(
            listen="[::1]:8000",
            policy=Path("/srv/srecovery/policy.toml"),
            loop_interval=0.5,
            hold_deadline=300.0,
            max_request_bytes=4096,
            spool_dir=Path("/srv/srecovery/controller"),
        ),
        auth=AuthConfig(
            munge_socket="/run/munge/other.socket",
            max_age=30.0,
            operator_group="hpc-admin",
            slurm_user="slurmsvc",
        ),
        watchdog=WatchdogConfig(interval=20.0, spool_dir=Path("/srv/srecovery/watchdog")),
        client=ClientConfig(url="https://head1.example.org:8000"),
        sidecar=SidecarConfig(
            node="gpu017",
            gpu_backend="sim",
            sim_dir=Path("/srv/srecovery/sim"),
            sim_gpus=4,
            expected_gpus=4,
            poll_interval=30.0,
            fast_interval=0.05,
            spool_dir=Path("/srv/srecovery/spool/{node}"),
            queue_max_events=1000,
            kmsg=False,
            ib_sysfs="",
            nvml_timeout=2.0,
            batch_max_events=1,
        ),
        hooks=HooksConfig(health_gate=True, controller_timeout=2.0),
        source=path,
    )


def test_left_out_keys_take_their_defaults(tmp_path):
    loaded = load_config(write(tmp_path, "[scheduler]\ncommand_timeout = 2.5\n"), env={})
    assert loaded.scheduler.command_timeout == 2.5
    assert loaded.scheduler.backend == "auto"
    assert loaded.store == StoreConfig()
    assert loaded.cluster.name == ""


def test_dotted_keys_at_top_level_are_plain_toml(tmp_path):
    loaded = load_config(write(tmp_path, 'scheduler.backend = "pyslurm"\n'), env={})
    assert loaded.scheduler.backend == "pyslurm"


def test_config_is_frozen():
    with pytest.raises(AttributeError, match="immutable"):
        Config().scheduler.backend = "pyslurm"  # type: ignore[misc]


def test_bad_choice_names_file_key_value_and_the_choices(tmp_path):
    path = write(tmp_path, '[scheduler]\nbackend = "slurmrest"\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert isinstance(excinfo.value, ValueError)
    assert problems(excinfo)[0].startswith(
        f"{path}:2: scheduler.backend = 'slurmrest': must be one of auto, scontrol, pyslurm"
    )


def test_bad_choice_suggests_the_nearest(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "warn"\n')
    with pytest.raises(ConfigError, match=r"log.level = 'warn': .* \(did you mean 'warning'\?\)"):
        load_config(path, env={})


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("backend = 3", "scheduler.backend = 3: must be a string, one of auto"),
        ("command_timeout = 0", "scheduler.command_timeout = 0: must be more than 0 seconds"),
        ("command_timeout = -1", "scheduler.command_timeout = -1: a duration cannot be negative"),
        ("command_timeout = 'soon'", "scheduler.command_timeout = 'soon': not a duration; write"),
        ("command_timeout = true", "scheduler.command_timeout = True: must be a duration"),
        ("command_timeout = inf", "scheduler.command_timeout = inf: a duration must be finite"),
        ("command_timeout = nan", "scheduler.command_timeout = nan: must be a number of seconds"),
        ("slurm_bin_dir = 'bin'", "scheduler.slurm_bin_dir = 'bin': must be an absolute path"),
        ("slurm_conf = 5", "scheduler.slurm_conf = 5: must be a string holding an absolute path"),
        ('slurm_conf = "/a\\u0000b"', "a path cannot contain a NUL character"),
    ],
)
def test_bad_scheduler_values(tmp_path, line, expected):
    path = write(tmp_path, f"[scheduler]\n{line}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert problems(excinfo) == [problems(excinfo)[0]]
    assert problems(excinfo)[0].startswith(f"{path}:2: ")
    assert expected in problems(excinfo)[0]


def test_store_path_must_be_absolute_and_not_empty(tmp_path):
    for value in ("state.db", ""):
        path = write(tmp_path, f'[store]\npath = "{value}"\n')
        with pytest.raises(ConfigError, match=r"store\.path = .*: must be an absolute path"):
            load_config(path, env={})


@pytest.mark.parametrize("name", ["my cluster", "-a", "a/b", "ä"])
def test_bad_cluster_names(tmp_path, name):
    path = write(tmp_path, f"[cluster]\nname = {json.dumps(name)}\n")
    with pytest.raises(ConfigError, match=r"cluster\.name = .*: must be a Slurm ClusterName"):
        load_config(path, env={})


def test_durations_in_the_file(tmp_path):
    for text, seconds in [("'90s'", 90.0), ("'5m'", 300.0), ("'1h'", 3600.0), ("7", 7.0)]:
        path = write(tmp_path, f"[scheduler]\ncommand_timeout = {text}\n")
        assert load_config(path, env={}).scheduler.command_timeout == seconds


def test_new_section_defaults():
    loaded = Config()
    assert loaded.controller == ControllerConfig(
        listen="0.0.0.0:7765",
        policy=Path("/etc/slurm-recovery/policy.toml"),
        loop_interval=1.0,
        hold_deadline=120.0,
        max_request_bytes=1048576,
        spool_dir=Path("/var/spool/slurm-recovery/controller"),
    )
    assert loaded.controller.listen_host_port == ("0.0.0.0", 7765)
    assert loaded.auth == AuthConfig(
        munge_socket="", max_age=60.0, operator_group="", slurm_user="slurm"
    )
    assert loaded.watchdog == WatchdogConfig(
        interval=10.0, spool_dir=Path("/var/lib/slurm-recovery/watchdog")
    )
    assert loaded.client == ClientConfig(url="http://localhost:7765")
    assert loaded.sidecar == SidecarConfig(
        node="",
        gpu_backend="nvml",
        sim_dir=Path("/var/lib/slurm-recovery/sim"),
        sim_gpus=8,
        expected_gpus=0,
        poll_interval=10.0,
        fast_interval=0.2,
        spool_dir=Path("/var/spool/slurm-recovery"),
        queue_max_events=100000,
        kmsg=True,
        ib_sysfs="/sys/class/infiniband",
        nvml_timeout=5.0,
        batch_max_events=500,
    )
    assert loaded.hooks == HooksConfig(health_gate=False, controller_timeout=0.5)


@pytest.mark.parametrize(
    ("section", "line", "expected"),
    [
        ("sidecar", "node = 'gpu 17'", "must be a Slurm node name"),
        ("sidecar", "node = '-gpu17'", "must be a Slurm node name"),
        ("sidecar", "node = 'gpu17/a'", "must be a Slurm node name"),
        ("sidecar", "node = 17", "must be a string"),
        ("sidecar", "gpu_backend = 'nvidia'", "must be one of nvml, sim, none"),
        ("sidecar", "gpu_backend = 'simm'", "(did you mean 'sim'?)"),
        ("sidecar", "gpu_backend = false", "must be a string, one of nvml, sim, none"),
        ("sidecar", "sim_dir = 'sim'", "must be an absolute path"),
        ("sidecar", "sim_dir = ''", "must be an absolute path"),
        ("sidecar", "sim_gpus = 0", "must be from 1 to 64"),
        ("sidecar", "sim_gpus = 65", "must be from 1 to 64"),
        ("sidecar", "sim_gpus = '8'", "must be a whole number from 1 to 64, without quotes"),
        ("sidecar", "sim_gpus = 8.0", "must be a whole number from 1 to 64"),
        ("sidecar", "sim_gpus = true", "must be a whole number from 1 to 64"),
        ("sidecar", "expected_gpus = -1", "must be from 0 to 64"),
        ("sidecar", "expected_gpus = 65", "must be from 0 to 64"),
        ("sidecar", "poll_interval = 0", "must be more than 0 seconds"),
        ("sidecar", "poll_interval = 'often'", "not a duration"),
        ("sidecar", "fast_interval = '0ms'", "must be more than 0 seconds"),
        ("sidecar", "fast_interval = -0.2", "cannot be negative"),
        ("sidecar", "spool_dir = 'spool'", "must be an absolute path"),
        ("sidecar", "spool_dir = ''", "must be an absolute path"),
        ("sidecar", "spool_dir = '/var/spool/{host}'", "the only placeholder a path may hold"),
        ("sidecar", "spool_dir = '/var/spool/{node'", "the only placeholder a path may hold"),
        ("sidecar", "spool_dir = '/var/spool/{}'", "the only placeholder a path may hold"),
        ("sidecar", "queue_max_events = 999", "must be from 1000 to 10000000"),
        ("sidecar", "queue_max_events = 10000001", "must be from 1000 to 10000000"),
        ("sidecar", "queue_max_events = 1e5", "must be a whole number"),
        ("sidecar", "kmsg = 'true'", "must be true or false"),
        ("sidecar", "kmsg = 'true'", "a quoted string is not a boolean"),
        ("sidecar", "kmsg = 1", "must be true or false, lower case and without quotes"),
        ("sidecar", "kmsg = 'yes'", "must be true or false"),
        ("sidecar", "ib_sysfs = 'sys/class/infiniband'", "must be an absolute path"),
        ("sidecar", "ib_sysfs = false", "must be a string holding an absolute path"),
        ("sidecar", "nvml_timeout = 0", "must be more than 0 seconds"),
        ("sidecar", "nvml_timeout = true", "must be a duration"),
        ("sidecar", "batch_max_events = 0", "must be from 1 to 1000"),
        ("sidecar", "batch_max_events = 1001", "must be from 1 to 1000"),
        ("hooks", "health_gate = 'false'", "must be true or false"),
        ("hooks", "health_gate = 0", "must be true or false"),
        ("hooks", "controller_timeout = 0", "must be more than 0 seconds"),
        ("hooks", "controller_timeout = 'fast'", "not a duration"),
        ("controller", "spool_dir = 'spool'", "must be an absolute path"),
        ("controller", "spool_dir = ''", "must be an absolute path"),
    ],
)
def test_bad_sidecar_and_hooks_values(tmp_path, section, line, expected):
    path = write(tmp_path, f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    [problem] = problems(excinfo)
    name = line.split(" = ")[0]
    assert problem.startswith(f"{path}:2: {section}.{name} = ")
    assert expected in problem


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("sim_gpus", 1),
        ("sim_gpus", 64),
        ("expected_gpus", 0),
        ("expected_gpus", 64),
        ("queue_max_events", 1000),
        ("queue_max_events", 10_000_000),
        ("batch_max_events", 1),
        ("batch_max_events", 1000),
        ("kmsg", False),
        ("node", "gpu-a01.rack_2"),
        ("ib_sysfs", ""),
    ],
)
def test_sidecar_bounds_accepted(key, value):
    assert getattr(config_from_dict({"sidecar": {key: value}}).sidecar, key) == value


def test_sidecar_spool_dir_node_placeholder(monkeypatch):
    monkeypatch.setattr(config.socket, "gethostname", lambda: "gpu3.cluster.example.org")
    templated = SidecarConfig(spool_dir=Path("/var/spool/srec/{node}"))
    assert templated.node_name == "gpu3"
    assert templated.spool_path() == Path("/var/spool/srec/gpu3")
    assert templated.spool_path("n7") == Path("/var/spool/srec/n7")
    named = msgspec.structs.replace(templated, node="sim-1")
    assert named.node_name == "sim-1"
    assert named.spool_path() == Path("/var/spool/srec/sim-1")
    assert SidecarConfig().spool_path("n7") == Path("/var/spool/slurm-recovery")
    loaded = config_from_dict({"sidecar": {"spool_dir": "/s/{node}/q-{node}", "node": "a"}})
    assert loaded.sidecar.spool_path() == Path("/s/a/q-a")


def test_hooks_booleans():
    assert config_from_dict({"hooks": {"health_gate": True}}).hooks.health_gate is True
    assert config_from_toml("[hooks]\nhealth_gate = false\n").hooks.health_gate is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:7765", ("0.0.0.0", 7765)),
        ("127.0.0.1:1", ("127.0.0.1", 1)),
        ("head1:65535", ("head1", 65535)),
        ("head1.cluster.example.org:80", ("head1.cluster.example.org", 80)),
        ("localhost:7765", ("localhost", 7765)),
        ("[::1]:7765", ("::1", 7765)),
        ("[::]:7765", ("::", 7765)),
        ("[fe80::1%eth0]:7765", ("fe80::1%eth0", 7765)),
    ],
)
def test_split_host_port(text, expected):
    assert split_host_port(text) == expected
    assert config_from_dict({"controller": {"listen": text}}).controller.listen == text


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0.0.0.0", "no port"),
        ("head1", "no port"),
        (":7765", "no host"),
        ("0.0.0.0:", "port '' must be a number from 1 to 65535"),
        ("0.0.0.0:0", "port '0' must be a number from 1 to 65535"),
        ("0.0.0.0:65536", "port '65536' must be a number from 1 to 65535"),
        ("0.0.0.0:-1", "must be a number from 1 to 65535"),
        ("0.0.0.0:http", "must be a number from 1 to 65535"),
        ("0.0.0.0:\u0663", "must be a number from 1 to 65535"),
        ("::1:7765", "an IPv6 address must be in brackets"),
        ("[::1:7765", "unclosed '['"),
        ("[::1]7765", "no port after the IPv6 address"),
        ("[::1]", "no port after the IPv6 address"),
        ("[head1]:7765", "'head1' is not an IPv6 address"),
        ("[1.2.3.4]:7765", "not an IPv6 address"),
        ("999.1.1.1:7765", "'999.1.1.1' is not an IPv4 address"),
        ("1.2.3:7765", "not an IPv4 address"),
        ("head_1:7765", "not a host name or IP address"),
        ("-head:7765", "not a host name or IP address"),
        ("my host:7765", "not a host name or IP address"),
        ("http://head1:7765", "a URL is not an address to listen on"),
        ("", "no port"),
    ],
)
def test_bad_listen_values(tmp_path, value, expected):
    path = write(tmp_path, f'[controller]\nlisten = "{value}"\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}:2: controller.listen = ")
    assert expected in problem
    assert '"[::1]:7765"' in problem  # says how to write it


def test_listen_must_be_a_string():
    with pytest.raises(ConfigError, match=r"controller\.listen = 7765: must be a string"):
        config_from_dict({"controller": {"listen": 7765}})
    with pytest.raises(ValueError, match="must be a string"):
        split_host_port(7765)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [1024, 1048576, 64 * 1024 * 1024])
def test_max_request_bytes_bounds_accepted(value):
    loaded = config_from_dict({"controller": {"max_request_bytes": value}})
    assert loaded.controller.max_request_bytes == value


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("max_request_bytes = 1023", "must be from 1024 to 67108864 (64 MiB) bytes"),
        ("max_request_bytes = 67108865", "must be from 1024 to 67108864 (64 MiB) bytes"),
        ("max_request_bytes = 0", "must be from 1024"),
        ("max_request_bytes = -1", "must be from 1024"),
        ("max_request_bytes = 1e6", "must be a whole number of bytes"),
        ("max_request_bytes = '1MiB'", "must be a whole number of bytes"),
        ("max_request_bytes = true", "must be a whole number of bytes"),
        ("loop_interval = 0", "controller.loop_interval = 0: must be more than 0 seconds"),
        ("hold_deadline = '0s'", "controller.hold_deadline = '0s': must be more than 0 seconds"),
        ("hold_deadline = 'soon'", "not a duration"),
        ("policy = 'policy.toml'", "controller.policy = 'policy.toml': must be an absolute path"),
        ("policy = ''", "controller.policy = '': must be an absolute path"),
    ],
)
def test_bad_controller_values(tmp_path, line, expected):
    path = write(tmp_path, f"[controller]\n{line}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}:2: controller.")
    assert expected in problem


@pytest.mark.parametrize(
    ("section", "line", "expected"),
    [
        ("auth", "munge_socket = 'munge.socket'", "must be an absolute path"),
        ("auth", "max_age = 0", "must be more than 0 seconds"),
        ("auth", "max_age = -5", "cannot be negative"),
        ("auth", "operator_group = 'hpc admin'", "must be a group name"),
        ("auth", "operator_group = '1admins'", "must be a group name"),
        ("auth", "operator_group = 5", "must be a string"),
        ("auth", "slurm_user = ''", "must be a user name"),
        ("auth", "slurm_user = 'slurm:slurm'", "must be a user name"),
        ("auth", "slurm_user = 64030", "must be a string"),
        ("watchdog", "interval = 0", "must be more than 0 seconds"),
        ("watchdog", "spool_dir = 'spool'", "must be an absolute path"),
        ("watchdog", "spool_dir = ''", "must be an absolute path"),
    ],
)
def test_bad_auth_and_watchdog_values(tmp_path, section, line, expected):
    path = write(tmp_path, f"[{section}]\n{line}\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}:2: {section}.")
    assert expected in problem


def test_auth_names_accepted():
    loaded = config_from_dict(
        {"auth": {"operator_group": "hpc-admin.ops_1", "slurm_user": "_slurm"}}
    )
    assert loaded.auth.operator_group == "hpc-admin.ops_1"
    assert loaded.auth.slurm_user == "_slurm"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://head1:7765", "http://head1:7765"),
        ("https://head1.example.org", "https://head1.example.org"),
        ("http://head1:7765/", "http://head1:7765"),
        ("http://[::1]:7765", "http://[::1]:7765"),
        ("https://proxy.example.org/srecovery/", "https://proxy.example.org/srecovery"),
    ],
)
def test_good_urls(value, expected):
    assert config_from_dict({"client": {"url": value}}).client.url == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("head1:7765", "must start with http:// or https://"),
        ("ftp://head1", "must start with http:// or https://"),
        ("HTTP://head1", "must start with http:// or https://"),
        ("//head1:7765", "must start with http:// or https://"),
        ("", "must start with http:// or https://"),
        ("http://", "no host after http://"),
        ("http://:7765", "no host after http://"),
        ("http://head1:99999", "not a valid URL"),
        ("http://head1:port", "not a valid URL"),
        ("http://head1:0", "port must be from 1 to 65535"),
        ("http://[::1:7765", "not a valid URL"),
        ("http://head 1:7765", "cannot contain spaces"),
        ("http://head1/?x=1", "must not contain '?' or '#'"),
        ("http://head1/#top", "must not contain '?' or '#'"),
    ],
)
def test_bad_urls(tmp_path, value, expected):
    path = write(tmp_path, f'[client]\nurl = "{value}"\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    [problem] = problems(excinfo)
    assert problem.startswith(f"{path}:2: client.url = ")
    assert expected in problem


def test_url_must_be_a_string():
    with pytest.raises(ConfigError, match=r"client\.url = 7765: must be a string holding a URL"):
        config_from_dict({"client": {"url": 7765}})


# --------------------------------------------------------------------------------- SRECOVERY_URL


def test_srecovery_url_overrides_the_file(tmp_path):
    path = write(tmp_path, '[client]\nurl = "http://head1:7765"\n[log]\nlevel = "debug"\n')
    loaded = load_config(path, env={URL_ENV_VAR: "https://head2:8443/"})
    assert loaded.client.url == "https://head2:8443"
    assert loaded.log.level == "debug"  # the rest of the file still applies
    assert loaded.source == path
    assert load_config(path, env={}).client.url == "http://head1:7765"


def test_srecovery_url_overrides_the_defaults(no_default_file):
    loaded = load_config(env={URL_ENV_VAR: "http://head2:7765"})
    assert loaded == Config(client=ClientConfig(url="http://head2:7765"))


def test_empty_srecovery_url_counts_as_unset(tmp_path, no_default_file):
    assert load_config(env={URL_ENV_VAR: ""}) == Config()
    path = write(tmp_path, '[client]\nurl = "http://head1:7765"\n')
    assert load_config(path, env={URL_ENV_VAR: ""}).client.url == "http://head1:7765"


def test_bad_srecovery_url_is_an_error_naming_the_variable(no_default_file):
    with pytest.raises(ConfigError) as excinfo:
        load_config(env={URL_ENV_VAR: "head2:7765"})
    [problem] = problems(excinfo)
    assert problem.startswith("$SRECOVERY_URL = 'head2:7765': must start with http:// or https://")
    assert "unset it" in problem


def test_srecovery_url_read_from_the_process_environment(monkeypatch, no_default_file):
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    monkeypatch.setenv(URL_ENV_VAR, "http://from-env:7765")
    assert load_config().client.url == "http://from-env:7765"


def test_config_from_toml_and_dict_ignore_srecovery_url(monkeypatch):
    monkeypatch.setenv(URL_ENV_VAR, "http://from-env:7765")
    assert config_from_toml("").client.url == "http://localhost:7765"
    assert config_from_dict({}).client.url == "http://localhost:7765"


def test_docs_and_example_mention_srecovery_url():
    assert "SRECOVERY_URL" in DOCS.read_text()
    assert "SRECOVERY_URL" in EXAMPLE.read_text()


# --------------------------------------------------------------------------------- unknown keys


def test_misspelt_key_suggests_the_right_one(tmp_path):
    path = write(tmp_path, "[scheduler]\ncomand_timeout = 5\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert problems(excinfo)[0].startswith(
        f"{path}:2: scheduler.comand_timeout: unknown key "
        "(did you mean 'scheduler.command_timeout'?) (keys of [scheduler]: backend,"
    )


def test_key_in_the_wrong_section_suggests_its_section(tmp_path):
    path = write(tmp_path, '[store]\nbackend = "scontrol"\n')
    with pytest.raises(ConfigError, match=r"store\.backend: unknown key \(did you mean 'sched"):
        load_config(path, env={})


def test_unknown_section_suggests_the_nearest(tmp_path):
    path = write(tmp_path, '[logging]\nlevel = "debug"\n')
    with pytest.raises(
        ConfigError, match=r":1: logging: unknown table \(did you mean '\[log\]'\?\)"
    ):
        load_config(path, env={})


def test_key_outside_any_section(tmp_path):
    path = write(tmp_path, 'level = "debug"\nfrobnicate = 1\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert problems(excinfo)[0].startswith(
        f"{path}:1: level: unknown key (did you mean 'log.level'?): write it under [log] "
        "(keys at the top level: "
        "cluster, scheduler,"
    )
    assert problems(excinfo)[1].startswith(f"{path}:2: frobnicate: unknown key (keys at the top")


def test_section_given_as_a_value(tmp_path):
    path = write(tmp_path, 'log = "debug"\n')
    with pytest.raises(ConfigError, match=r"log = 'debug': must be a table: write \[log\] on"):
        load_config(path, env={})


def test_misspelt_key_in_the_wrong_section(tmp_path):
    path = write(tmp_path, '[store]\nbakend = "scontrol"\n')
    with pytest.raises(
        ConfigError, match=r"store\.bakend: unknown key \(did you mean 'scheduler\.backend'\?\)"
    ):
        load_config(path, env={})


def test_unknown_key_with_nothing_close(tmp_path):
    path = write(tmp_path, "[store]\nzzz = 1\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    expected = f"{path}:2: store.zzz: unknown key (keys of [store]: path, retention)"
    assert problems(excinfo) == [expected]


def test_every_problem_is_reported_at_once(tmp_path):
    path = write(
        tmp_path,
        '[scheduler]\nbackend = "x"\ncommand_timeout = 0\n[store]\npath = "rel"\n[logs]\n',
    )
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert len(problems(excinfo)) == 4
    assert str(excinfo.value) == "\n".join(problems(excinfo))
    lines = [problem.split(": ", 1)[0] for problem in problems(excinfo)]
    assert lines == [f"{path}:{line}" for line in (2, 3, 5, 6)]


# --------------------------------------------------------------------------------- syntax


def test_syntax_error_names_file_and_line_and_shows_it(tmp_path):
    path = write(tmp_path, "[scheduler]\n\nbackend = scontrol\n")
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    message = str(excinfo.value)
    assert message.startswith(f"{path}:3: invalid TOML: Invalid value (column 11)")
    assert "strings must be quoted" in message
    assert message.endswith("\n    backend = scontrol")


def test_syntax_error_missing_equals(tmp_path):
    path = write(tmp_path, '[log]\nlevel "debug"\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: invalid TOML: Expected"):
        load_config(path, env={})


def test_syntax_error_at_end_of_document_names_the_last_line(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "debug\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: invalid TOML"):
        load_config(path, env={})


def test_duplicate_key_is_a_syntax_error(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "debug"\nlevel = "info"\n')
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:3: invalid TOML"):
        load_config(path, env={})


def test_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[cluster]\n# caf\u00e9\nname = ""\n'.encode("latin-1"))
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: not UTF-8 text"):
        load_config(path, env={})


def test_config_from_toml_and_dict_without_a_file():
    assert config_from_toml('[log]\nlevel = "debug"\n').log.level == "debug"
    assert config_from_dict({}) == Config()
    with pytest.raises(ConfigError, match=r"^config: log\.level = 'loud'"):
        config_from_dict({"log": {"level": "loud"}})
    with pytest.raises(ConfigError, match=r"^config:1: invalid TOML"):
        config_from_toml("[log\n")


# --------------------------------------------------------------------------------- durations

UNITS = sorted(UNIT_MS)


@given(st.floats(min_value=0, allow_nan=False, allow_infinity=False))
def test_duration_round_trip(seconds):
    text = format_duration(seconds)
    assert isinstance(text, str)
    assert parse_duration(text) == seconds


@given(st.integers(min_value=0, max_value=10**12))
def test_whole_seconds_format_with_units(seconds):
    text = format_duration(seconds)
    assert re.fullmatch(r"(\d+d)?(\d+h)?(\d+m)?(\d+s)?", text)
    assert parse_duration(text) == seconds


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(UNITS))
def test_number_with_unit(count, unit):
    assert parse_duration(f"{count}{unit}") == count * UNIT_MS[unit] / 1000
    assert parse_duration(f" {count} {unit} ") == count * UNIT_MS[unit] / 1000


@given(st.lists(st.tuples(st.integers(0, 1000), st.sampled_from(UNITS)), min_size=1, max_size=5))
def test_compound_durations_add_up(parts):
    text = "".join(f"{count}{unit}" for count, unit in parts)
    assert parse_duration(text) == sum(count * UNIT_MS[unit] for count, unit in parts) / 1000


@given(st.one_of(st.integers(min_value=0, max_value=2**62), st.floats(0, 1e18)))
def test_numbers_are_seconds(value):
    assert parse_duration(value) == float(value)
    as_text = str(value) if isinstance(value, int) else f"{Decimal(repr(value)):f}"
    assert parse_duration(as_text) == float(value)


@given(st.text(max_size=20))
def test_garbage_is_rejected_with_a_clear_message(text):
    assume(re.search(r"[^0-9.smhd\s]", text) or not re.search(r"\d", text))
    with pytest.raises(ValueError) as excinfo:
        parse_duration(text)
    message = str(excinfo.value)
    assert "duration" in message
    assert '"90s", "5m"' in message
    assert "units: ms, s, m, h, d" in message


@pytest.mark.parametrize(
    "text",
    ["", "s", "5 minutes", "1.2.3s", "5mm", "-5s", "1e3", "inf", "5 m s", "h1", "1 h 2", "\u0663s"],
)
def test_garbage_examples(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@given(st.one_of(st.integers(max_value=-1), st.floats(max_value=-1e-300, allow_infinity=True)))
def test_negative_durations_are_rejected(value):
    with pytest.raises(ValueError, match="negative"):
        parse_duration(value)


@pytest.mark.parametrize("value", [True, None, [1], {"s": 1}, float("nan"), float("inf"), 10**400])
def test_non_durations_are_rejected(value):
    with pytest.raises(ValueError, match=r"duration|seconds"):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), True, "5s"])
def test_format_duration_rejects_non_durations(value):
    with pytest.raises(ValueError):
        format_duration(value)


def test_format_duration_examples():
    assert format_duration(0) == "0s"
    assert format_duration(15) == "15s"
    assert format_duration(5400) == "1h30m"
    assert format_duration(90061) == "1d1h1m1s"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(1e-5) == "0.00001s"


# --------------------------------------------------------------------------------- the schema


# nested dictionaries are slow to draw on a loaded machine (CI's second core busy with xdist),
# and one config can take 300 ms to check there: what is tested is the answer, not its time
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from([*SECTIONS, "other"]),
        st.dictionaries(
            st.sampled_from(sorted({key.name for key in KEYS} | {"typo"})),
            st.one_of(
                st.text(max_size=30),
                st.integers(),
                st.floats(),
                st.booleans(),
                st.sampled_from(
                    [
                        "auto",
                        "debug",
                        "/abs",
                        "5m",
                        "scontrol",
                        "[::1]:80",
                        "h:1",
                        "http://h",
                        "sim",
                        "/s/{node}",
                    ]
                ),
            ),
        ),
    )
)
def test_any_input_gives_a_config_or_a_config_error(data):
    try:
        loaded = config_from_dict(data, "/f.toml")
    except ConfigError as exc:
        assert exc.problems
        assert all(line.startswith("/f.toml: ") for line in exc.problems)
    else:
        assert loaded.source == Path("/f.toml")


def test_keys_are_the_struct_fields():
    keys = [(key.section, key.name) for key in KEYS]
    fields = [
        (section, f.name) for section, cls in SECTIONS.items() for f in msgspec.structs.fields(cls)
    ]
    assert keys == fields
    assert list(SECTIONS) == [f.name for f in msgspec.structs.fields(config.ConfigFile)]
    assert [f.name for f in msgspec.structs.fields(Config)] == [*SECTIONS, "source"]
    assert len({key.dotted for key in KEYS}) == len(KEYS)


def test_defaults_are_values_their_own_check_accepts():
    defaults = Config()
    for key in KEYS:
        assert getattr(getattr(defaults, key.section), key.name) == DEFAULTS[key.dotted]
        assert DEFAULTS[key.dotted] == key.default
        as_toml = str(key.default) if isinstance(key.default, Path) else key.default
        reread = config_from_dict({key.section: {key.name: as_toml}})
        assert reread == defaults, key.dotted
        assert key.doc and key.type, key.dotted


def test_example_file_has_every_key():
    data = tomllib.loads(EXAMPLE.read_text())
    found = {f"{section}.{name}" for section, table in data.items() for name in table}
    assert found == {key.dotted for key in KEYS}


def test_example_file_loads_and_equals_the_defaults():
    loaded = load_config(EXAMPLE, env={})
    assert loaded == Config(source=EXAMPLE)


def test_example_file_comments_each_key():
    lines = EXAMPLE.read_text().splitlines()
    for key in KEYS:
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{key.name} = "))
        assert lines[index - 1].startswith("#"), f"{key.dotted} has no comment above it"


def docs_entries() -> dict[str, str]:
    """docs/configuration.md split at its ``#### `section.key` `` headings."""
    text = DOCS.read_text()
    parts = re.split(r"^#### `([a-z_]+\.[a-z_]+)`\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_docs_describe_every_key_with_its_type_and_default():
    entries = docs_entries()
    assert set(entries) == {key.dotted for key in KEYS}
    for key in KEYS:
        entry = entries[key.dotted]
        documented_type = re.search(r"^- Type: (.*)$", entry, flags=re.MULTILINE)
        assert documented_type, key.dotted
        assert documented_type.group(1).replace("`", "") == key.type, key.dotted
        default = re.search(r"^- Default: `(.*)`$", entry, flags=re.MULTILINE)
        assert default, key.dotted
        value = tomllib.loads(f"v = {default.group(1)}")["v"]
        loaded = config_from_dict({key.section: {key.name: value}})
        assert getattr(getattr(loaded, key.section), key.name) == key.default, key.dotted
        assert "```toml" in entry, f"{key.dotted} has no example"


def test_docs_examples_are_valid():
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)
    assert blocks
    for block in blocks:
        config_from_toml(block, "docs/configuration.md")


def test_docs_cover_location_precedence_and_slurm_conf():
    text = DOCS.read_text()
    for needle in ("/etc/slurm-recovery/config.toml", "SRECOVERY_CONFIG", "--config", "slurm.conf"):
        assert needle in text


@pytest.mark.parametrize("which", ["tls_cert", "tls_key"])
def test_a_tls_certificate_and_key_go_together(which):
    with pytest.raises(ConfigError, match=r"tls_cert and controller\.tls_key go together"):
        config_from_toml(f'[controller]\n{which} = "/etc/slurm-recovery/tls/x.pem"\n')
    both = config_from_toml('[controller]\ntls_cert = "/a.crt"\ntls_key = "/a.key"\n')
    assert (both.controller.tls_cert, both.controller.tls_key) == ("/a.crt", "/a.key")


def test_asdict_gives_sections_then_source():
    loaded = config_from_toml('[log]\nlevel = "debug"\n', "/f.toml")
    data = loaded.asdict()
    assert list(data) == [*SECTIONS, "source"]
    assert data["log"] == {"level": "debug"}
    assert data["scheduler"]["command_timeout"] == 15.0
    assert data["source"] == Path("/f.toml")


def test_problems_name_the_line_of_the_key(tmp_path):
    path = write(tmp_path, '[log]\nlevel = "debug"\n\n[sidecar]\nnode = "gpu 1"\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert problems(excinfo)[0].startswith(f"{path}:5: sidecar.node = 'gpu 1': must be")
