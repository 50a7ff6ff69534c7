# README's commands: `make demo` (set up, then run the main job) and `make test` (set up, then the tests).
VENV := .venv
STAMP := $(VENV)/.setup-done
PYTEST_ARGS ?=

.PHONY: setup demo test test-slow test-gpu

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	bash scripts/demo.sh

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-slow: setup
	$(VENV)/bin/python -m pytest --run-slow $(PYTEST_ARGS)
