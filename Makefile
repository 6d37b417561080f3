# Each target creates/uses .venv and installs what it needs: on a fresh clone
# `make demo` and `make test` are the only commands a newcomer types.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  := $(VENV)/.torch
BENCH  := $(VENV)/.bench
TORCH_VERSION := 2.13.0
# A pip constraint holding torch at the build installed (2.13.0+cpu), written before each install
# that comes after torch's, so that no package can replace it.
TORCH_PIN := $(VENV)/torch-constraint.txt

.PHONY: demo test bench bench-accuracy lint influxdb chromium alertmanager prometheus node-exporter slurm munge clean torch-demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# torch for the collector's real torch.distributed run (CPU build; pinned so that pip
# never resolves a multi-GB CUDA build). Kept out of the runtime dependencies.
$(TORCH): $(STAMP)
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	touch $(TORCH)

# The peers the benchmarks compare with (ruptures, river, nvidia-resiliency-ext, HTA: the
# `bench` extra), installed under the torch pin: nvidia-resiliency-ext asks for torch>=2.3,
# which the CPU build already satisfies, and the pin keeps pip from resolving a CUDA build.
$(BENCH): $(TORCH) pyproject.toml
	$(PY) -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $(TORCH_PIN)
	$(PY) -m pip install --quiet -c $(TORCH_PIN) -e '.[bench]'
	touch $(BENCH)

# apt_install: install Debian package $(2) unless one of the commands $(1) is on PATH.
# As root apt-get runs directly, otherwise through sudo; `env` carries DEBIAN_FRONTEND in
# both cases (a bare `$$SUDO VAR=value cmd` makes the assignment the command when SUDO is
# empty). tests/test_makefile.py runs these recipes against a stub apt-get.
define apt_install
@for c in $(1); do command -v $$c >/dev/null 2>&1 && exit 0; done; \
echo "$(firstword $(1)) not found: installing Debian's $(2) package"; \
if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
{ $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2) >/dev/null; } || { \
  echo "error: could not install $(2) (apt-get install $(2))$(3)" >&2; exit 1; }
endef

# The tests talk to a real InfluxDB (Debian's `influxdb` package, v1.6.7).
influxdb:
	$(call apt_install,influxd,influxdb,. Install it by hand or point the suite at a server: RANKSCOPE_TEST_INFLUX_URL=http://host:8086)

# The report test opens the incident report in headless Chromium (Debian's `chromium`).
chromium:
	$(call apt_install,chromium chromium-browser,chromium)

# The events tests run a real Alertmanager posting to the receiver (Debian's
# `prometheus-alertmanager`, v0.25, which installs /usr/bin/prometheus-alertmanager).
alertmanager:
	$(call apt_install,prometheus-alertmanager alertmanager,prometheus-alertmanager)

# ... and a real Prometheus evaluating an `up == 0` rule in front of it (Debian's `prometheus`, v2.42).
prometheus:
	$(call apt_install,prometheus,prometheus)

# ... and node_exporter serving NCCL Inspector's .prom files to it with its textfile collector, as
# clusters run it (Debian's `prometheus-node-exporter`, v1.5, which installs /usr/bin/prometheus-node-exporter).
node-exporter:
	$(call apt_install,prometheus-node-exporter node_exporter,prometheus-node-exporter)

# The actions tests drain nodes of a real Slurm cluster on this host: one slurmctld and one
# `slurmd -N <node>` per node (Debian's `slurm-wlm`, 22.05, daemons in /usr/sbin), authenticated
# by munge (Debian's `munge`, whose client /usr/bin/munge stands for it).
slurm: munge
	$(call apt_install,slurmctld slurmd,slurm-wlm)

munge:
	$(call apt_install,munge munged,munge)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# pytest on TEST_WORKERS processes (pytest-xdist; 0: in this one). Each test file runs on one
# worker, and the files that read a dataset built once per run (IL-0477 at full scale, the
# compute-slowdown built-in) on one worker together: tests/conftest.py.
TEST_WORKERS ?= 2

test: $(STAMP) $(TORCH) influxdb chromium alertmanager prometheus node-exporter slurm lint
	$(VENV)/bin/rankscope dashboards check
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

demo: $(STAMP)
	$(VENV)/bin/rankscope demo

bench: $(BENCH) influxdb
	$(PY) -m benchmarks.run

# Accuracy suite (the full-size runs the tests leave to it) + peers side by side.
bench-accuracy: $(BENCH) influxdb
	$(PY) -m benchmarks.run accuracy peers

# A real 8-process gloo DDP job on CPU, instrumented, rank 5 slow in mlp from iteration 15.
torch-demo: $(TORCH)
	$(VENV)/bin/rankscope torch-demo

clean:
	rm -rf $(VENV) .rankscope .pytest_cache .ruff_cache
