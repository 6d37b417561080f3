"""The Makefile's package-install recipes, run against a stub apt-get.

A fresh machine lacks influxd, chromium, Alertmanager, Prometheus, node_exporter, Slurm and munge; `make test` installs them with apt-get, as root
(CI) or through sudo. These tests run the real recipes with a PATH on which neither program
exists and `apt-get`/`sudo`/`id` are stubs that record how they were called, so a recipe that
only works where the packages are already installed fails here, not on a newcomer's machine.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAKE = shutil.which("make")


def _stub_path(tmp_path: Path, uid: int, apt_fails: bool = False) -> tuple[dict[str, str], Path]:
    """A PATH holding only stubs (and `env`): apt-get, sudo and id record their calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    scripts = {
        "id": f'#!/bin/sh\necho {uid}\n',
        "apt-get": (
            "#!/bin/sh\n"
            f'echo "apt-get DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> "{log}"\n'
            f"exit {1 if apt_fails else 0}\n"
        ),
        "sudo": f'#!/bin/sh\necho "sudo $*" >> "{log}"\nexec "$@"\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "env").symlink_to(shutil.which("env"))
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    return env, log


def _make(target: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    return subprocess.run(
        [MAKE, "-s", "-C", str(ROOT), target], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(("target", "package"), [
    ("influxdb", "influxdb"), ("chromium", "chromium"),
    ("alertmanager", "prometheus-alertmanager"), ("prometheus", "prometheus"),
    ("node-exporter", "prometheus-node-exporter"), ("munge", "munge"),
])
def test_installs_as_root_without_sudo(tmp_path: Path, target: str, package: str) -> None:
    env, log = _stub_path(tmp_path, uid=0)
    result = _make(target, env)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls == [
        "apt-get DEBIAN_FRONTEND=noninteractive update -qq",
        f"apt-get DEBIAN_FRONTEND=noninteractive install -y -qq {package}",
    ]
    assert f"installing Debian's {package} package" in result.stdout


def test_installs_through_sudo_when_not_root(tmp_path: Path) -> None:
    env, log = _stub_path(tmp_path, uid=1000)
    result = _make("influxdb", env)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("sudo env DEBIAN_FRONTEND=noninteractive apt-get update")
    assert "apt-get DEBIAN_FRONTEND=noninteractive install -y -qq influxdb" in calls


def test_failed_install_says_what_to_do(tmp_path: Path) -> None:
    env, _ = _stub_path(tmp_path, uid=0, apt_fails=True)
    result = _make("influxdb", env)
    assert result.returncode != 0
    assert "could not install influxdb" in result.stderr
    assert "RANKSCOPE_TEST_INFLUX_URL" in result.stderr


def test_present_program_installs_nothing(tmp_path: Path) -> None:
    env, log = _stub_path(tmp_path, uid=0)
    fake = Path(env["PATH"]) / "chromium-browser"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    result = _make("chromium", env)
    assert result.returncode == 0, result.stderr
    assert not log.exists()


@pytest.mark.parametrize("program", ["prometheus-node-exporter", "node_exporter"])
def test_node_exporter_under_either_name_installs_nothing(tmp_path: Path, program: str) -> None:
    """Debian's package installs prometheus-node-exporter; upstream's tarball node_exporter."""
    env, log = _stub_path(tmp_path, uid=0)
    fake = Path(env["PATH"]) / program
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    result = _make("node-exporter", env)
    assert result.returncode == 0, result.stderr
    assert not log.exists()


@pytest.mark.parametrize("program", ["prometheus-alertmanager", "alertmanager"])
def test_alertmanager_under_either_name_installs_nothing(tmp_path: Path, program: str) -> None:
    """Debian's package installs prometheus-alertmanager; upstream's tarball alertmanager."""
    env, log = _stub_path(tmp_path, uid=0)
    fake = Path(env["PATH"]) / program
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    result = _make("alertmanager", env)
    assert result.returncode == 0, result.stderr
    assert not log.exists()


def test_failed_alertmanager_install_names_the_package(tmp_path: Path) -> None:
    env, _ = _stub_path(tmp_path, uid=0, apt_fails=True)
    result = _make("alertmanager", env)
    assert result.returncode != 0
    assert "could not install prometheus-alertmanager" in result.stderr


def test_make_test_installs_alertmanager_prometheus_and_node_exporter() -> None:
    """`make test` runs the real Alertmanager, Prometheus and node_exporter end to end: it depends
    on their install targets."""
    assert MAKE is not None
    result = subprocess.run([MAKE, "-n", "-C", str(ROOT), "--print-data-base", "--question", "test"],
                            capture_output=True, text=True, timeout=60)
    [deps] = [line for line in result.stdout.splitlines() if line.startswith("test: ")]
    assert {"alertmanager", "prometheus", "node-exporter"} <= set(deps.split())


@pytest.mark.parametrize("target", ["bench", "bench-accuracy"])
def test_the_benchmarks_install_the_peers_without_replacing_the_cpu_torch(target: str) -> None:
    """`make bench` runs the peers (ruptures, river, nvidia-resiliency-ext, HTA): on a fresh clone it
    installs the `bench` extra, after the CPU torch and under a pip constraint that holds torch at
    the build installed (nvidia-resiliency-ext asks for torch>=2.3; unpinned, pip may resolve a CUDA
    build)."""
    assert MAKE is not None
    result = subprocess.run([MAKE, "-n", "-B", "-C", str(ROOT), target],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    def at(text: str) -> int:
        [i] = [i for i, line in enumerate(lines) if text in line]
        return i

    torch = at("pip install --quiet torch==")
    pin = at("> .venv/torch-constraint.txt")
    assert "version('torch')" in lines[pin]
    extra = at("-e '.[bench]'")
    assert "-c .venv/torch-constraint.txt" in lines[extra]
    assert torch < pin < extra < at("-m benchmarks.run")


def test_slurm_installs_munge_first_then_slurm(tmp_path: Path) -> None:
    env, log = _stub_path(tmp_path, uid=0)
    result = _make("slurm", env)
    assert result.returncode == 0, result.stderr
    installs = [c.rsplit(" ", 1)[1] for c in log.read_text().splitlines() if " install " in c]
    assert installs == ["munge", "slurm-wlm"]
