# make demo: set up .venv when missing and run the main example.
# make test: the same set-up, then every test and property test (bench cases run once).
# make bench: the side-by-side benchmark suite.
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

test: $(STAMP)
	$(PY) -m pytest -q tests property_tests

bench: $(STAMP)
	$(PY) -m pytest -q bench

clean:
	rm -rf $(VENV) build *.egg-info
