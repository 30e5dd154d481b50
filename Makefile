# `make demo` and `make test` create .venv on first use, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 is the build this course is tested with; set TORCH_SPEC="torch" for the newest.
TORCH_SPEC ?= torch==2.13.0
# On Linux without an NVIDIA GPU, PyPI's torch is the CUDA build (gigabytes of NVIDIA libraries
# that can't run): take the CPU build from PyTorch's index when it answers within a few seconds,
# and pip's own index otherwise (or if that install fails). PyPI's macOS wheels are CPU builds.
CPU_INDEX := https://download.pytorch.org/whl/cpu

# $(call install_torch,PIP): TORCH_SPEC, from CPU_INDEX where that is the right build.
define install_torch
	@index=""; \
	if [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  if timeout 5 $(PY) -c "import urllib.request as u; \
	       u.urlopen(u.Request('$(CPU_INDEX)/torch/', method='HEAD'), timeout=3)" >/dev/null 2>&1; then \
	    index="--index-url $(CPU_INDEX)"; echo "no NVIDIA GPU: torch's CPU build from $(CPU_INDEX)"; \
	  else echo "no NVIDIA GPU, $(CPU_INDEX) unreachable: torch from pip's configured index"; fi; \
	fi; \
	$(1) install -q $$index "$(TORCH_SPEC)" || { [ -n "$$index" ] && $(1) install -q "$(TORCH_SPEC)"; }
endef

.PHONY: demo lab test test-no-triton test-quick test-browser lint slides preflight notebooks clean-venv

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(call install_torch,$(BIN)/pip)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python -m nanoserve demo

# The course: JupyterLab on the lessons, from .venv (it prints the URL to open; Ctrl-C stops it).
# LAB_ARGS for JupyterLab's own flags, e.g. LAB_ARGS="--no-browser --port 8890"; as root (a
# container) JupyterLab refuses to start without --allow-root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(BIN)/.installed
	$(BIN)/jupyter lab notebooks/ $(LAB_ARGS)

# Two pytest workers on two cores: one OpenMP thread each (more threads than cores is many times
# slower). Timing tests (marker serial) run alone afterwards. Every stage runs even if an earlier
# one failed, so one report shows everything; the target fails if any stage did.
test: $(BIN)/.installed
	@status=0; \
	NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -n 2 --dist loadscope -m "not serial" tests \
	  --ignore=tests/course/browser || status=1; \
	NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -m serial tests --ignore=tests/course/browser || status=1; \
	if ls notebooks/*.ipynb >/dev/null 2>&1; then \
	  OMP_NUM_THREADS=1 NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -n 2 --dist loadscope --nbval-lax notebooks \
	    || status=1; fi; \
	exit $$status

# triton has wheels for Linux only, so everything but the Triton kernels must work without it
# (macOS, Windows). A second environment, the dependencies less triton, runs what depends on
# whether triton is there (the kernel dispatch and kernel tests, which skip the Triton ones saying
# why; the grader, which leaves ex08 out; gpu_check), the engine, model, server and CLI end to end,
# and lesson 00. The rest of the suite is the same Python in both environments, and
# tests/test_packaging.py imports every module with triton hidden, in `make test` too.
# It lives inside .venv: ignored by git, removed with it.
NO_TRITON := $(VENV)/no-triton
$(NO_TRITON)/.installed: pyproject.toml
	test -x $(NO_TRITON)/bin/python || $(PY) -m venv $(NO_TRITON)
	$(call install_torch,$(NO_TRITON)/bin/pip)
	$(NO_TRITON)/bin/python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
	  print('\n'.join(d for d in p['dependencies'] + p['optional-dependencies']['dev'] \
	                  if not d.startswith('triton')))" > $(NO_TRITON)/requirements.txt
	$(NO_TRITON)/bin/pip install -q -r $(NO_TRITON)/requirements.txt
	$(NO_TRITON)/bin/pip install -q -e . --no-deps
	@$(NO_TRITON)/bin/python -c "import importlib.util as u, sys; \
	  sys.exit('triton got installed: this environment must not have it' if u.find_spec('triton') else 0)"
	touch $@

test-no-triton: $(NO_TRITON)/.installed
	@status=0; \
	NANOSERVE_QUICK=1 $(NO_TRITON)/bin/python -m pytest -q -n 2 --dist loadscope -m "not serial" \
	  tests/test_packaging.py tests/test_cli.py tests/test_env.py tests/test_layers.py tests/kernels \
	  tests/model tests/engine/test_engine.py tests/engine/test_validation.py tests/serve \
	  tests/exercises/test_grade.py tests/measure/test_gpu_check.py tests/course/test_demo.py \
	  || status=1; \
	OMP_NUM_THREADS=1 NANOSERVE_QUICK=1 $(NO_TRITON)/bin/python -m pytest -q --nbval-lax \
	  notebooks/00_*.ipynb || status=1; \
	exit $$status

# ruff, and the layers of pyproject's import-linter contracts
lint: $(BIN)/.installed
	$(BIN)/ruff check nanoserve tests exercises solutions benchmarks scripts
	$(BIN)/lint-imports

# Decks that open with no network: reveal.js, require.js, jQuery and MathJax from the npm registry
# (package-lock.json), then every lesson executed headless (quick mode; SLIDES=full for this
# device's sizes, as a presenter would on their own machine) and exported with its figures, tables
# and speaker notes to slides/NN_name.slides.html (scripts/build_decks.py).
SLIDES ?= quick
node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund

slides: $(BIN)/.installed node_modules/.package-lock.json
	$(BIN)/python scripts/build_decks.py $(if $(filter full,$(SLIDES)),--full,)

# Before a workshop, on each attendee's machine: the environment, this device's ceilings, one lesson
# executed in quick mode, and what to fix; under two minutes.
preflight: $(BIN)/.installed
	$(BIN)/python -m nanoserve.course.preflight

# JupyterLab and the decks in headless Chromium (Debian's package, /usr/bin/chromium; .ci/run
# installs it), driven by Playwright; needs the decks of `make slides`. Screenshots: test-artifacts/.
test-browser: $(BIN)/.installed
	NANOSERVE_BROWSER_TESTS=1 $(BIN)/python -m pytest -q tests/course/browser

clean-venv:
	rm -rf $(VENV)
