"""A real Slurm cluster on this one host (Debian's ``slurm-wlm`` 22.05 and ``munge``) for the
actions tests: ``munged``, one ``slurmctld`` and one ``slurmd -N <node>`` per node name.

Everything lives in a temporary folder: the munge key and socket, ``slurm.conf``, the state,
spool and log folders. Each daemon runs in the foreground as a child of the test process, on
free loopback ports, as root (CI runs as root; slurmd must, to be its own SlurmdUser). What
several slurmd on one host need (Slurm's "multiple slurmd" set-up): each node
``NodeHostname=localhost`` with a ``Port`` of its own, ``SlurmdSpoolDir`` and ``SlurmdPidFile``
with ``%n`` in them, no cgroups (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``),
``SlurmdParameters=config_overrides`` (the node's CPUs and memory as configured, not as
measured). Clients find it through ``SLURM_CONF`` (:attr:`SlurmCluster.env`), munge through
``AuthInfo=socket=...`` in the same file. A missing program is an error that says what to
install, never a skipped test.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from tests.influx_server import free_port

PROGRAMS = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "scontrol": "slurm-wlm",
            "sinfo": "slurm-wlm"}

CONF = """\
ClusterName=rankscope-test
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=5
"""


def _which(program: str) -> str:
    exe = shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin")
    if exe is None:
        raise RuntimeError(f"{program} not found: install Debian's '{PROGRAMS[program]}' package "
                           f"(make test does: make slurm)")
    return exe


class SlurmCluster:
    """munged, slurmctld and one slurmd per name in ``nodes``; :meth:`start` waits until
    ``sinfo`` shows every node idle."""

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = list(nodes)
        self.root = Path(tempfile.mkdtemp(prefix="rankscope-slurm-"))
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: dict[str, subprocess.Popen] = {}

    def _write_conf(self) -> None:
        for d in ("munge", "state", "spool", "run", "log", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o711)
        text = CONF.format(controller=socket.gethostname().split(".")[0], ctld_port=free_port(),
                           slurmd_port=free_port(), root=self.root)
        for n in self.nodes:
            text += (f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={free_port()} "
                     f"CPUs=1 RealMemory=100 State=UNKNOWN\n")
        text += "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        self.conf.write_text(text)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()

    def _munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        m = self.root / "munge"
        self._spawn("munged", [_which("munged"), "-F", "-f", f"--key-file={key}",
                               f"--socket={m}/munge.socket", f"--pid-file={m}/munged.pid",
                               f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"])
        self._wait(lambda: (m / "munge.socket").exists(), 10, "munged's socket")

    def start(self, timeout_s: float = 60.0) -> SlurmCluster:
        for program in PROGRAMS:
            _which(program)
        self._write_conf()
        self._munge()
        self.start_controller()
        for n in self.nodes:
            self._spawn(f"slurmd-{n}", [_which("slurmd"), "-D", "-N", n])
        self._wait(lambda: self.idle() == set(self.nodes), timeout_s, "every node idle in sinfo")
        return self

    def start_controller(self) -> None:
        """slurmctld (again, after :meth:`stop_controller`: from its saved state)."""
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])
        self._wait(lambda: self.scontrol("ping").returncode == 0, 30, "slurmctld answering ping")

    def stop_controller(self) -> None:
        """Stop slurmctld (the scheduler down: scontrol cannot reach it)."""
        self._stop("slurmctld")

    def pause_controller(self) -> None:
        """Freeze slurmctld (SIGSTOP): it accepts connections and never answers (a hang)."""
        self.procs["slurmctld"].send_signal(signal.SIGSTOP)

    def resume_controller(self) -> None:
        self.procs["slurmctld"].send_signal(signal.SIGCONT)

    def scontrol(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run([_which("scontrol"), *args], capture_output=True, text=True, env=self.env,
                              timeout=timeout)

    def idle(self) -> set[str]:
        """Nodes ``sinfo`` shows idle (and not drained)."""
        try:
            out = subprocess.run([_which("sinfo"), "-h", "-N", "-o", "%N %t"], capture_output=True, text=True,
                                 env=self.env, timeout=10).stdout
        except subprocess.TimeoutExpired:
            return set()
        return {line.split()[0] for line in out.splitlines() if line.split()[1:] == ["idle"]}

    def node(self, name: str) -> dict[str, str]:
        """``State`` and ``Reason`` of a node as scontrol shows them."""
        line = self.scontrol("show", "node", "-o", name).stdout.strip()
        state = next((w.split("=", 1)[1] for w in line.split() if w.startswith("State=")), "")
        reason = line.split(" Reason=", 1)[1] if " Reason=" in line else ""
        return {"state": state, "reason": reason}

    def reset(self) -> None:
        """Every node back to idle with no reason (between tests)."""
        self.resume_controller()
        for n in self.nodes:
            if "DRAIN" in self.node(n)["state"] or "DOWN" in self.node(n)["state"]:
                self.scontrol("update", f"NodeName={n}", "State=RESUME")
        self._wait(lambda: self.idle() == set(self.nodes), 30, "every node idle again")
        self._mark = len(self._log_text())

    def _log_text(self) -> str:
        path = self.root / "log" / "slurmctld.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def log(self) -> str:
        """slurmctld's log since the last :meth:`reset`."""
        return self._log_text()[getattr(self, "_mark", 0):]

    @staticmethod
    def _wait(condition, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm test cluster: no {what} within {timeout_s:g} s")
            time.sleep(0.2)

    def _stop(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def cleanup(self) -> None:
        for name in [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]:
            self._stop(name)
        shutil.rmtree(self.root, ignore_errors=True)
