# steplens: `make demo` runs the main job, `make test` runs the tests (both set everything up).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STEPLENS := $(VENV)/bin/steplens

DIST ?= dist

.PHONY: setup demo test test-unit test-busy lint stack-up stack-down clean compose-check wheels influxd-early

setup: $(VENV)/.installed

$(VENV)/.installed: requirements-dev.txt constraints.txt schema/pyproject.toml producer/pyproject.toml stream_jobs/pyproject.toml sinks/pyproject.toml stack/pyproject.toml
	bash stack/src/steplens/stack/recipes/system_deps.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -r requirements-dev.txt \
	  -e schema -e producer[gpu,torch,fast,text,exporter,s3] -e stream_jobs[history] -e sinks[report,mlflow] -e stack
	touch $@

# A fresh machine's first stack start builds influxd (minutes of cargo and go): begun here, in
# the background, while pip installs; `steplens stack up` waits for it (a no-op once built)
STEPLENS_CACHE ?= $(HOME)/.cache/steplens
influxd-early:
	@bash stack/src/steplens/stack/recipes/system_deps.sh
	@mkdir -p $(STEPLENS_CACHE)/logs
	@STEPLENS_CACHE=$(STEPLENS_CACHE) nohup bash stack/src/steplens/stack/recipes/build_influxdb.sh \
	  >$(STEPLENS_CACHE)/logs/build-influxdb-early.log 2>&1 &

demo: influxd-early setup
	$(STEPLENS) demo

stack-up: influxd-early setup
	$(STEPLENS) stack up

stack-down:
	-$(STEPLENS) stack down

# The stack is started once (first time: builds InfluxDB, fetches Kafka and S3 jars).
# TESTS narrows a run: make test TESTS=tests/stack
TESTS ?= tests
pytest = $(1) $(PY) -m pytest -q $(TESTS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran"; exit 1; fi; exit $$rc

test: influxd-early setup stack-up
	$(call pytest,)

# The same run with one core kept busy beside it (tests/busy_core.py), as on a loaded machine
test-busy: influxd-early setup stack-up
	$(call pytest,$(PY) tests/busy_core.py --)

test-unit: setup
	$(PY) -m pytest -q tests -m "not stack"

# The five parts as wheels in dist/, for `pip install dist/...` elsewhere (README.md)
wheels: setup
	rm -f $(DIST)/steplens_*.whl
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w $(DIST) ./schema ./producer ./stream_jobs ./sinks ./stack

lint: setup
	$(VENV)/bin/ruff check schema producer stream_jobs sinks stack tests bench
	$(VENV)/bin/ruff format --check schema producer stream_jobs sinks stack tests bench
	$(VENV)/bin/mypy schema/src/steplens/schema producer/src/steplens/producer \
	  stream_jobs/src/steplens/stream_jobs sinks/src/steplens/sinks stack/src/steplens/stack

# docker-compose.yml for real, alone and with docker-compose.exposed.yml: images built here
# without a registry, each stack started, checked end to end (a worker killed in the local one)
# and removed (docs/stack.md, "Docker users"). Behind an HTTPS proxy with its own CA:
# STEPLENS_BUILD_CA_DIR=/usr/local/share/ca-certificates (the Python image is named after it)
compose-check: setup
	$(PY) -m steplens.stack.compose_check

clean: stack-down
	rm -rf $(VENV)
