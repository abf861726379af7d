# make demo: run the main job.  make test: run the tests.  Both create .venv on first use.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# DDS traffic never leaves loopback, and every run gets its own domain so parallel runs and
# other machines never cross-talk. A caller may pin ROS_DOMAIN_ID; otherwise one is drawn per run.
export ROS_AUTOMATIC_DISCOVERY_RANGE := LOCALHOST
ROS_DOMAIN_ID ?= $(shell python3 -c "import os; print(1 + int.from_bytes(os.urandom(2), 'little') % 100)")
export ROS_DOMAIN_ID
export PYTHONUNBUFFERED := 1

.PHONY: demo test venv bench clean

venv: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt setup.py $(wildcard sim2real_ros/*/_*.c)
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	@echo "ROS_DOMAIN_ID=$(ROS_DOMAIN_ID) ROS_AUTOMATIC_DISCOVERY_RANGE=$(ROS_AUTOMATIC_DISCOVERY_RANGE)"
	$(PY) -m sim2real_ros.cli demo

test: $(STAMP)
	@echo "ROS_DOMAIN_ID=$(ROS_DOMAIN_ID) ROS_AUTOMATIC_DISCOVERY_RANGE=$(ROS_AUTOMATIC_DISCOVERY_RANGE)"
	$(PY) -m pytest -q test

bench: $(STAMP)
	$(PY) -m bench.run_all

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
