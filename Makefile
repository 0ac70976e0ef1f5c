# servescope — `make report` (the main job) and `make test`. Everything missing is created on first use:
# the suite's virtual environment (.venv), the engine's environment and the tiny model (per-user cache).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
UV_PIN := uv==0.13.9
SUITE ?= data/suites/default.yaml
ARGS ?=
LAB_ARGS ?=
CACHE := $(or $(SERVESCOPE_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/servescope)

.PHONY: help venv engine model doctor report lint test test-fast lab check-engines clean distclean bench-client bench-agreement bench-telemetry bench-trace bench-report bench-stability bench-openloop bench-ray browser

help:
	@echo "make report     run the default suite on the embedded engine; open reports/latest/index.html"
	@echo "make doctor     check this machine end to end (one real token eager and compiled); run it when a report fails"
	@echo "make test       every test, including real runs of the embedded engine (what CI runs)"
	@echo "make test-fast  the tests that need no engine"
	@echo "make lint       ruff over lib/ and tests/ (part of make test)"
	@echo "make lab        JupyterLab on notebooks/ with the suite's kernel"
	@echo "make check-engines  every SGLang/vLLM/transformers release from its published source (not in CI; network)"
	@echo "make bench-client     our streaming client vs vLLM's benchmark client and NVIDIA AIPerf on a zero-work stub"
	@echo "make bench-agreement  our client vs vLLM's benchmark client measuring the embedded vLLM"
	@echo "make bench-telemetry  CPU cost of NVML sampling at 10 and 100 Hz (fake NVML without a GPU)"
	@echo "make bench-trace      analyse 1M- and 10M-kernel nsys timelines, Parquet and SQLite exports (goal: 2M rows/s, 2 GB)"
	@echo "make bench-report     the default suite cold, timed (goal: 900 s), launches against configurations x repetitions"
	@echo "make bench-stability  the default suite twice from empty stores: same headline and tier per thread?"
	@echo "make bench-openloop   the load client's achieved open-loop rate against a zero-work stub (1,000 req/s asked)"
	@echo "make bench-ray        a suite's stub points through the Ray runner (simulated nodes) against the local runner"
	@echo "make clean      remove reports, results and caches of this clone (keeps the shared engine/model cache)"
	@echo "make distclean  clean, plus .venv and the per-user cache ($(CACHE))"

# uv (pinned with the suite) installs from pip's own sources (lib/servescope/pipsources.py, standard library only) in
# a fraction of pip's time; pip does it where uv cannot
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q $(UV_PIN)
	UV_NATIVE_TLS=1 $(VENV)/bin/uv pip install -q --python $(PY) --index-strategy unsafe-best-match \
	  --compile-bytecode $$($(PY) lib/servescope/pipsources.py) -e '.[dev]' || \
	  { $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '.[dev]'; }
	@touch $@

venv: $(STAMP)

engine: venv
	@$(PY) -m servescope.cli engine-env vllm >/dev/null

model: engine
	@$(PY) -m servescope.cli make-model >/dev/null

doctor: model
	$(PY) -m servescope.cli doctor --suite $(SUITE)

# the doctor's quick part first (no launch): it stops here when a configuration is known to fail on this machine
report: model
	@$(PY) -m servescope.cli doctor --quick --suite $(SUITE)
	$(PY) -m servescope.cli run $(SUITE) $(ARGS)
	@echo "open reports/latest/index.html"

lint: venv
	$(VENV)/bin/ruff check lib tests benchmarks

# the front-page test drives a real headless browser: Debian's chromium, installed where it is missing
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "installing Debian's chromium for the front-page test (apt-get)"; \
	  if [ "$$(id -u)" = 0 ]; then APT=; else APT=sudo; fi; \
	  $$APT apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$APT apt-get install -y -qq chromium >/dev/null; }

# three pytest workers, a test file each at a time (module fixtures render a reference once): with two, this 2-core
# machine's cores sat 20-40% idle while workers waited on servers starting (docs/testing.md); TEST_WORKERS=0 runs in
# one process
TEST_WORKERS ?= 3
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: model lint browser
	$(PY) -m pytest $(XDIST) --durations=25 $(ARGS)

test-fast: venv lint browser
	$(PY) -m pytest $(XDIST) -m "not slow" $(ARGS)

lab: venv
	$(PY) -m pip install -q -e '.[dev,lab]'
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root) $(LAB_ARGS)

# not part of CI: minutes, ~1 GB of published wheels/sdists fetched once into the per-user cache
check-engines: venv
	$(PY) -m servescope.cli check-engines --readme $(ARGS)

bench-client: model
	$(PY) benchmarks/bench_client.py $(ARGS)

bench-agreement: model
	$(PY) benchmarks/bench_agreement.py $(ARGS)

bench-telemetry: venv
	$(PY) benchmarks/bench_telemetry.py $(ARGS)

bench-trace: venv
	$(PY) benchmarks/bench_trace.py $(ARGS)

bench-report: model
	$(PY) benchmarks/bench_report.py $(ARGS)

bench-stability: model
	$(PY) benchmarks/bench_stability.py $(ARGS)

bench-openloop: venv
	$(PY) benchmarks/bench_openloop.py $(ARGS)

bench-ray: venv
	$(PY) benchmarks/bench_ray.py $(ARGS)

clean:
	rm -rf reports data/runs .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} + 2>/dev/null || true

distclean: clean
	rm -rf $(VENV) *.egg-info lib/*.egg-info "$(CACHE)"
