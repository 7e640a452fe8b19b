# Commands for a fresh clone (see README "Quick start"):
#   make run    set up .venv, then start the server (or, with no LLM configured, the offline demo)
#   make cli    the same, as a chat in this terminal
#   make demo   the offline demo (scripted LLM, tiny models), whatever the config says
#   make test   set up .venv with the extras, then ruff, the whole test suite and the quick mutation check
#               (what CI runs)
#   make mutate MODULE=access   mutmut on one module (MODULE=all: every module) against its covering tests;
#               docs/TESTING.md says how long each takes
# Ray Serve (`models_server.py --engine ray`, 240 MB) is an extra: `make setup-ray` (make test installs it).
VENV   ?= .venv
PY     := $(VENV)/bin/python
CONFIG ?= configs/config.default.yaml
PORT   ?= 8004

.PHONY: setup setup-ray run cli test demo mutate llm

$(VENV)/.installed: requirements.txt requirements-models.txt requirements-dev.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q torch==2.13.0  # first, so nothing pulls a multi-GB CUDA build
	$(VENV)/bin/pip install -q -r requirements.txt -r requirements-models.txt -r requirements-dev.txt
	$(VENV)/bin/pip install -q --no-deps controlnet-aux==0.0.10  # tests run its HED / MLSD / OpenPose code only
	touch $@

$(VENV)/.installed-ray: $(VENV)/.installed requirements-ray.txt
	$(VENV)/bin/pip install -q -r requirements-ray.txt
	touch $@

setup: $(VENV)/.installed

setup-ray: $(VENV)/.installed-ray

run: setup
	HUGGINGGPT_VIA="make run" $(PY) tools/start.py --config $(CONFIG) --port $(PORT)

cli: setup
	HUGGINGGPT_VIA="make cli" $(PY) tools/start.py --config $(CONFIG) --mode cli

llm: setup  # a small local LLM on llama.cpp for configs/config.llama.yaml (README "A local LLM on llama.cpp")
	$(PY) tools/local_llm.py $(LLM_ARGS)

demo: setup
	HUGGINGGPT_VIA="make demo" $(PY) tools/demo.py --port $(PORT)

test: setup-ray
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -rs -n 2 --durations=15  # two processes (pytest-xdist): most tests wait on servers
	$(PY) tools/mutation_audit.py --quick --check  # mutmut on the quick modules (pyproject.toml): a few minutes
	$(PY) tools/mutate.py --quick  # the few hand-written mutations mutmut cannot express (multi-line, cross-module, files it does not audit)

MODULE ?= all
mutate: setup
	$(PY) tools/mutation_audit.py $(MODULE) --table
