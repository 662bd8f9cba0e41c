# make demo: set up .venv when missing and run the main example.
# make test: the same set-up, then every test and property test (bench cases run once; in parallel,
#   TEST_WORKERS below), then the checks (make checks, two at a time): mypy over the package, its
#   entry-point modules (_tdtree_plugins) and the typed tensorclass example (make typecheck), the
#   docstring examples (make doctest), the HTML reference (make docs), the import floors
#   (lint-imports, contract in pyproject.toml), ruff check and ruff format --check (settings in
#   pyproject.toml) (make lint).
# make docs: the HTML reference (Sphinx: the docstrings, README.md, ARCHITECTURE.md) in docs/_build/html;
#   make test builds it too, warnings (broken cross-references included) as errors.
# make bench: the side-by-side benchmark suite, results in bench/results/latest.json
#   (python -m bench.report prints their summary and the size sweeps' growth, --table every case,
#   --plot FILE.svg a chart;
#   python -m bench.compare REF compares with a git ref).
# make bench-quick: a representative subset (cases marked quick), under 2 minutes.
VENV ?= .venv
# make test runs the suites in pytest-xdist workers (auto: one per core), each with one torch thread:
# the workers fill the cores, and a thread pool per worker would wait at each parallel kernel for a
# core another worker holds. --dist loadfile: a module runs in one worker, so what a module makes once
# (module-scoped fixtures that start process groups, the matrix's cached compiled traces) is made once
# (xdist 3.8's loadgroup does not group under pytest 9: its group suffix on node ids is not read).
# --no-loadscope-reorder: modules are handed out in the order given, property_tests (the matrices, the
# longest modules) first; xdist's own order, most tests first, left modules of a few slow tests (process
# groups, fresh interpreters) for the end, where one worker ran them while the other sat idle.
TEST_WORKERS ?= auto
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test checks typecheck doctest lint docs bench bench-quick clean

$(PY):
	python3 -m venv $(VENV)

# torch is installed first and pinned, so pip never resolves torch itself.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/tour.py
	$(PY) examples/train_functional.py

test: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder property_tests tests bench --benchmark-disable --durations=20
	$(MAKE) --no-print-directory -j2 --output-sync=target checks

# The checks after the suites, two at a time: mypy takes as long as the others together (each
# target's output is printed whole when it ends).
checks: typecheck doctest docs lint

typecheck: $(STAMP)
	$(PY) -m mypy tdtree _tdtree_plugins examples/typed_tensorclass.py

doctest: $(STAMP)
	$(PY) -m pytest -q --doctest-modules tdtree

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check

# the source directory is the repository root (conf.py in docs/); -n: broken cross-references warn;
# -E: every page read afresh, so a warning cannot hide in the cache of a failed build
DOCS_OPTS := -b html -c docs -n -W --keep-going -q -E

docs: $(STAMP)
	$(PY) -m sphinx $(DOCS_OPTS) . docs/_build/html
	@echo "docs/_build/html/index.html"

# Keep in step with BENCH_ARGS in bench/compare.py.
# pytest-benchmark's own tables are left out (its ops are 1 / mean): bench.report prints the summary,
# and its table of every case with REPORT_OPTS=--table (--plot FILE.svg draws them).
BENCH_OPTS := --benchmark-max-time=0.25 --benchmark-min-rounds=20 --benchmark-warmup=on \
	--benchmark-warmup-iterations=100 --benchmark-disable-gc --benchmark-quiet
REPORT_OPTS ?=

bench: $(STAMP)
	$(PY) -m pytest -q bench $(BENCH_OPTS) --benchmark-json=bench/results/latest.json
	$(PY) -m bench.report bench/results/latest.json $(REPORT_OPTS)

bench-quick: $(STAMP)
	$(PY) -m pytest -q bench -m quick $(BENCH_OPTS) --benchmark-json=bench/results/quick.json
	$(PY) -m bench.report bench/results/quick.json $(REPORT_OPTS)

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/api
