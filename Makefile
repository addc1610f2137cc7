# tidelog: every target installs what it needs first, so a fresh clone needs only `make serve` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install serve test demo bench lint proto clean

install: $(STAMP)

# Reinstall only when the project's metadata changes: `make install` is idempotent and cheap.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: install
	@echo "make serve: the broker and its gRPC server arrive with issue 3 (the broker); only the commit log exists yet." >&2
	@exit 2

test: install
	$(BIN)/python -m pytest -q

demo: install
	@echo "make demo: the end-to-end pipeline needs the broker (issue 3) and the Spark source (issue 6); not built yet." >&2
	@exit 2

bench: install
	$(BIN)/python benchmarks/log_throughput.py

lint: install
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

proto: install
	@echo "make proto: no .proto sources yet; the gRPC contract arrives with issue 3." >&2
	@exit 2

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
