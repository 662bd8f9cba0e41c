# make demo: set up .venv when missing and run the main example.
# make test: the same set-up, then every test and property test (bench cases run once), the docstring
#   examples (doctests), the import floors (lint-imports, contract in pyproject.toml), ruff check and
#   ruff format --check (settings in pyproject.toml) and mypy over the package, its entry-point modules (_tdtree_plugins) and the typed
#   tensorclass example.
# make bench: the side-by-side benchmark suite, results in bench/results/latest.json
#   (python -m bench.report prints them; python -m bench.compare REF compares with a git ref).
# make bench-quick: a representative subset (cases marked quick), under 2 minutes.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench bench-quick clean

$(PY):
	python3 -m venv $(VENV)

# torch is installed first and pinned, so pip never resolves torch itself.
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/tour.py
	$(PY) examples/train_functional.py

test: $(STAMP)
	$(PY) -m pytest -q tests property_tests bench --benchmark-disable
	$(PY) -m pytest -q --doctest-modules tdtree
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check
	$(VENV)/bin/ruff format --check
	$(PY) -m mypy tdtree _tdtree_plugins examples/typed_tensorclass.py

# Keep in step with BENCH_ARGS in bench/compare.py.
BENCH_OPTS := --benchmark-max-time=0.25 --benchmark-min-rounds=20 --benchmark-warmup=on \
	--benchmark-warmup-iterations=100 --benchmark-disable-gc --benchmark-sort=name \
	--benchmark-columns=median,iqr,ops,rounds

bench: $(STAMP)
	$(PY) -m pytest -q bench $(BENCH_OPTS) --benchmark-json=bench/results/latest.json
	$(PY) -m bench.report bench/results/latest.json

bench-quick: $(STAMP)
	$(PY) -m pytest -q bench -m quick $(BENCH_OPTS) --benchmark-json=bench/results/quick.json
	$(PY) -m bench.report bench/results/quick.json

clean:
	rm -rf $(VENV) build *.egg-info
