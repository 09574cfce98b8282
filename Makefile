# Two commands do all set-up on a fresh machine: `make lab` opens the course, `make test` runs
# every test (unit tests, every notebook under nbval, the browser test) and builds the site from
# the notebooks that run executed. `make site` builds the site alone.
PYTHON   ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
READY    := $(VENV)/.ready
EXECUTED := artifacts/executed
SITE     := _site

# Where torch comes from. Default: PyTorch's CPU-only index on Linux without an NVIDIA GPU (no
# gigabytes of CUDA libraries), the default index where `nvidia-smi` sees a GPU (its torch is
# the CUDA build) and on macOS (CPU/MPS wheels). A torch wheel pip already has locally (a
# wheelhouse in pip's find-links) wins, and then the index is never asked.
# Override: `make TORCH_INDEX=` (default index) or `make TORCH_INDEX=https://download.pytorch.org/whl/cu128`.
HAS_NVIDIA  := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH_INDEX ?= $(if $(or $(HAS_NVIDIA),$(filter Darwin,$(shell uname -s))),,https://download.pytorch.org/whl/cpu)
TORCH_PIN   := $(shell grep -E '^torch==' requirements.txt)

.PHONY: lab test site bench clean

$(READY): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "ckpt-lab needs Python 3.11 or newer: make PYTHON=python3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@if [ -n "$(TORCH_INDEX)" ] && ! $(BIN)/python -m pip install --quiet --dry-run --no-index --no-deps "$(TORCH_PIN)" >/dev/null 2>&1; then \
	    echo "Installing $(TORCH_PIN) from $(TORCH_INDEX) (make TORCH_INDEX= uses the default index)"; \
	    $(BIN)/python -m pip install --quiet --timeout 30 --retries 2 --extra-index-url "$(TORCH_INDEX)" "$(TORCH_PIN)"; \
	fi
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $(READY)

# Jupyter refuses to run as root unless told; containers (Docker, some clouds) often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

lab: $(READY)
	$(BIN)/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG)

# nbval saves every notebook it runs, with its outputs and widget state, to $(EXECUTED)/
# (notebooks/conftest.py); the site is built from those runs, so no notebook runs twice.
test: $(READY)
	rm -rf $(EXECUTED)
	$(BIN)/python -m pytest
	$(BIN)/python tools/build_site.py $(EXECUTED) $(SITE) --require-all

site: $(READY)
	rm -rf $(EXECUTED)
	$(BIN)/python -m pytest -q notebooks
	$(BIN)/python tools/build_site.py $(EXECUTED) $(SITE) --require-all

bench: $(READY)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info $(SITE) artifacts
