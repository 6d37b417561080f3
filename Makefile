# Each target creates/uses .venv and installs what it needs: on a fresh clone
# `make demo` and `make test` are the only commands a newcomer types.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TORCH  := $(VENV)/.torch

.PHONY: demo test bench bench-accuracy lint influxdb chromium clean torch-demo

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

# The tests talk to a real InfluxDB (Debian's `influxdb` package, v1.6.7).
influxdb:
	@command -v influxd >/dev/null 2>&1 || { \
	  echo "influxd not found: installing Debian's influxdb package"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq influxdb >/dev/null; } || { \
	    echo "error: could not install InfluxDB (apt-get install influxdb)."; \
	    echo "       Install it by hand, or point the suite at a server: RANKSCOPE_TEST_INFLUX_URL=http://host:8086"; exit 1; }; }

# The report test opens the incident report in headless Chromium (Debian's `chromium`).
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  echo "chromium not found: installing Debian's chromium package"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || { \
	    echo "error: could not install Chromium (apt-get install chromium)."; exit 1; }; }

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) $(TORCH) influxdb chromium lint
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
