# Each target creates/uses .venv and installs what it needs: on a fresh clone
# `make demo` and `make test` are the only commands a newcomer types.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test bench lint influxdb clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

# The tests talk to a real InfluxDB (Debian's `influxdb` package, v1.6.7).
influxdb:
	@command -v influxd >/dev/null 2>&1 || { \
	  echo "influxd not found: installing Debian's influxdb package"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  { $$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq influxdb >/dev/null; } || { \
	    echo "error: could not install InfluxDB (apt-get install influxdb)."; \
	    echo "       Install it by hand, or point the suite at a server: RANKSCOPE_TEST_INFLUX_URL=http://host:8086"; exit 1; }; }

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP) influxdb lint
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/rankscope demo

bench: $(STAMP) influxdb
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) .rankscope .pytest_cache .ruff_cache
