# Two commands do all set-up on a fresh machine: `make lab` opens the course, `make test` runs
# every test (unit tests, every notebook under nbval, the browser test).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
READY  := $(VENV)/.ready

.PHONY: lab test bench clean

$(READY): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(READY)

# Jupyter refuses to run as root unless told; containers (Docker, some clouds) often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(READY)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

test: $(READY)
	$(BIN)/python -m pytest

bench: $(READY)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info
