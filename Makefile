# Two commands for a fresh clone (see README "Quick start"):
#   make run    set up .venv, then start the server (or, with no LLM configured, the offline demo)
#   make test   set up .venv, then ruff, the whole test suite and the quick mutation audit (what CI runs)
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/config.default.yaml
PORT   ?= 8004

.PHONY: setup run test demo

$(VENV)/.installed: requirements.txt requirements-models.txt requirements-ray.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0  # first, so nothing pulls a multi-GB CUDA build
	$(VENV)/bin/pip install -q -r requirements.txt -r requirements-models.txt -r requirements-ray.txt -r requirements-dev.txt
	$(VENV)/bin/pip install -q --no-deps controlnet-aux==0.0.10  # tests run its HED / MLSD / OpenPose code only
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) tools/start.py --config $(CONFIG) --port $(PORT)

demo: setup
	$(PY) tools/demo.py --port $(PORT)

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs
	$(PY) tools/mutate.py --quick  # a subset of the mutation audit: a few minutes (the full one: tools/mutate.py)
