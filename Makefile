# Two commands for a newcomer: `make train` and `make test`. Both create .venv when missing and
# install dew with the pinned versions of requirements.lock.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On an accelerator machine: `make ACCELERATOR=tpu train` (or cuda12, cuda13) adds JAX's plugin for
# the locked jax (pyproject.toml's extras of those names); empty on a CPU.
ACCELERATOR ?=
comma := ,
EXTRAS := test,tracking,docs$(if $(ACCELERATOR),$(comma)$(ACCELERATOR))
STAMP := $(VENV)/.dew-installed$(if $(ACCELERATOR),-$(ACCELERATOR))

.PHONY: train test test-fast test-system test-accelerator lint format lock clean docs

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# setuptools prints a banner at every editable install ("Editable installation ... be careful
	@# with folders ... named like your package"): a note for src-less layouts, not a problem here.
	PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet -c requirements.lock -e ".[$(EXTRAS)]"
	@touch $(STAMP)

# Class-conditional EDM on the embedded digits; run again to resume from the last checkpoint.
train: $(STAMP)
	$(BIN)/python -m dew.main --config=experiments/edm.py --workdir=runs/edm

# The suite is compile-bound (XLA compiles on one core each): one worker per core, whole files
# per worker so module fixtures run once. TEST_WORKERS=0 runs it in this process.
# Two tiers (tests/README.md): `make test-fast` (unit and parity tests, minutes) and
# `make test-system` (tests/system, tests/user_paths: CLI runs, kills, restarts, many processes,
# Trainer runs); `make test` is both, fast first. Each tier runs in two passes: most tests with
# XLA's quick-compile flag, then those marked default_compiler or execution_bound with XLA's default
# optimisation (DEW_TEST_DEFAULT_COMPILER=1: in process, no child pytest per test). Exit status 5
# ("no tests collected") is not a failure: a tier may have no such tests.
TEST_WORKERS ?= 2
SYSTEM_DIRS := tests/system tests/user_paths
DEFAULT_LEVEL := default_compiler or execution_bound
PYTEST := $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=25
define run_tier
	$(PYTEST) -m "not ($(DEFAULT_LEVEL))" $(1) || test $$? -eq 5
	DEW_TEST_DEFAULT_COMPILER=1 $(PYTEST) -m "$(DEFAULT_LEVEL)" $(1) || test $$? -eq 5
endef

test: test-fast test-system

test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pyright --pythonpath $(BIN)/python
	$(call run_tier,tests $(addprefix --ignore=,$(SYSTEM_DIRS) tests/accelerator))

test-system: $(STAMP)
	$(call run_tier,$(wildcard $(SYSTEM_DIRS)))

# What only an accelerator shows (tests/accelerator: the TPU's kernels, its platform start), in this
# process, without tests/conftest.py's CPU set-up; skipped where the backend is not a TPU. CI has
# no accelerator: run it on the chip (README "Accelerators").
test-accelerator: $(STAMP)
	$(BIN)/python -m pytest --noconftest -p no:cacheprovider tests/accelerator -q

# The documentation site under .cache/site, warnings as errors (tests/system/test_docs.py builds it too).
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
