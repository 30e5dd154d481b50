# `make demo` and `make test` create .venv on first use, then run.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch==2.13.0 is the CPU build this course is tested with; set TORCH_SPEC="torch" for CUDA.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-quick lint slides notebooks clean-venv

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(BIN)/.installed
	$(BIN)/python -m nanoserve demo

# Two pytest workers on two cores: one OpenMP thread each (more threads than cores is many times
# slower). Timing tests (marker serial) run alone afterwards. Every stage runs even if an earlier
# one failed, so one report shows everything; the target fails if any stage did.
test: $(BIN)/.installed
	@status=0; \
	NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -n 2 --dist loadscope -m "not serial" tests || status=1; \
	NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -m serial tests || status=1; \
	if ls notebooks/*.ipynb >/dev/null 2>&1; then \
	  OMP_NUM_THREADS=1 NANOSERVE_QUICK=1 $(BIN)/python -m pytest -q -n 2 --dist loadscope --nbval-lax notebooks \
	    || status=1; fi; \
	exit $$status

lint: $(BIN)/.installed
	$(BIN)/ruff check nanoserve tests exercises solutions benchmarks scripts

# Offline decks: `npm install reveal.js@4` here first; the decks then load it from node_modules.
REVEAL := $(if $(wildcard node_modules/reveal.js),--SlidesExporter.reveal_url_prefix=../node_modules/reveal.js,)

slides: $(BIN)/.installed
	mkdir -p slides
	$(BIN)/jupyter nbconvert --to slides $(REVEAL) --output-dir slides notebooks/*.ipynb

clean-venv:
	rm -rf $(VENV)
