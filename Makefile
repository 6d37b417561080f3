# Each target creates/uses .venv and installs what it needs: on a fresh clone
# `make demo` and `make test` are the only commands a newcomer types.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  := $(VENV)/.torch

.PHONY: demo test bench bench-accuracy lint influxdb chromium alertmanager prometheus clean torch-demo

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# torch for the collector's real torch.distributed run (CPU build; pinned so that pip
# never resolves a multi-GB CUDA build). Kept out of the runtime dependencies.
$(TORCH): $(STAMP)
	$(PY) -m pip install --quiet torch==2.13.0
	touch $(TORCH)

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

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) $(TORCH) influxdb chromium alertmanager prometheus lint
	$(VENV)/bin/rankscope dashboards check
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/rankscope demo

bench: $(STAMP) $(TORCH) influxdb
	$(PY) -m benchmarks.run

# Accuracy suite + peers side by side (ruptures, river, nvidia-resiliency-ext, HTA: the `bench` extra).
# The CPU torch goes in first so that nvidia-resiliency-ext never pulls a CUDA build.
bench-accuracy: $(STAMP) $(TORCH) influxdb
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m benchmarks.run accuracy peers

# A real 8-process gloo DDP job on CPU, instrumented, rank 5 slow in mlp from iteration 15.
torch-demo: $(TORCH)
	$(VENV)/bin/rankscope torch-demo

clean:
	rm -rf $(VENV) .rankscope .pytest_cache .ruff_cache
