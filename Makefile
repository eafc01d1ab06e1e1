# Two commands for a newcomer: `make train` and `make test`. Both create .venv when missing and
# install dew with the pinned versions of requirements.lock.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dew-installed

.PHONY: train test lint format lock clean docs

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools prints a banner at every editable install ("Editable installation ... be careful
	@# with folders ... named like your package"): a note for src-less layouts, not a problem here.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -c requirements.lock -e ".[test,tracking,docs]"
	@touch $(STAMP)

# Class-conditional EDM on the embedded digits; run again to resume from the last checkpoint.
train: $(STAMP)
	$(BIN)/python -m dew.main --config=experiments/edm.py --workdir=runs/edm

# The suite is compile-bound (XLA compiles on one core each): one worker per core, whole files
# per worker so module fixtures run once. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pyright --pythonpath $(BIN)/python
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25

# The documentation site under .cache/site, warnings as errors (tests/test_docs.py builds it too).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pyright --pythonpath $(BIN)/python

format: $(STAMP)
	$(BIN)/ruff format dew tests experiments benchmarks

lock: $(STAMP)
	@printf '%s\n' "# Exact versions tested together (Python 3.11, CPU). \`make\` installs with these as constraints:" \
	  '#   pip install -c requirements.lock -e ".[test,tracking,docs]"' "# Regenerate after changing pyproject.toml: make lock" > requirements.lock
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e ' >> requirements.lock

clean:
	rm -rf $(VENV) .cache runs
