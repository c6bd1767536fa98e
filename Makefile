# Quick start (README): `make run` sets up and runs the main job; `make test` sets up and runs the tests.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test setup setup-test bench clean

# PYTHONWARNINGS: setuptools prints a screen of notices about editable installs on every build.
QUIET  := PYTHONWARNINGS=ignore::UserWarning

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(QUIET) $(PIP) install -q --upgrade pip
	$(QUIET) $(PIP) install -q -e .
	touch $@

$(TSTAMP): pyproject.toml $(STAMP)
	bash scripts/setup_test_env.sh $(VENV)
	touch $@

setup: $(STAMP)
setup-test: $(TSTAMP)

run: setup
	$(VENV)/bin/planner simulate --model gpt3-175b --gpu a100-80gb --num-gpus 1024 \
	    --strategy tp=8,pp=16,vp=3,mbs=1,gbs=1536,sp=1,recompute=selective
	$(VENV)/bin/planner recommend --model gpt3-175b --gpu a100-80gb --num-gpus 1024 --gbs 1536

# two phases: the tests not marked serial on two workers, then the serial ones alone (pyproject markers)
test: setup-test
	$(VENV)/bin/python -m pytest -p no:cacheprovider -rs -n 2 -m "not serial" && \
	$(VENV)/bin/python -m pytest -p no:cacheprovider -rs -m serial

# Speed targets live in these scripts (docs/recommend.md, event_engine.md, economics.md, app.md),
# not in timed unit tests: the machines are shared and noisy.
bench: setup-test
	$(VENV)/bin/python scripts/bench_recommend.py
	$(VENV)/bin/python scripts/bench_event.py
	$(VENV)/bin/python scripts/bench_sweep.py --quick
	$(VENV)/bin/python scripts/bench_app.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
