# The two set-up commands: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint docs-build docs venv profiles param-study translation bench reference

$(BIN)/waypost: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# waypost is installed editable, and pip compiles nothing for that: compile
# its modules once here, or every step runner compiles them from source
# where PYTHONDONTWRITEBYTECODE is set (Docker images, CI), ~20 ms a job.
# compileall writes whatever that variable says, and skips what is fresh.
venv: $(BIN)/waypost
	$(BIN)/python -m compileall -q src/waypost

# Make `snakemake --profile local` work by bare name (never overwrites a
# profile of yours with the same name).
profiles: venv
	$(BIN)/waypost profiles install

demo: profiles
	$(BIN)/snakemake --profile profiles/local
	@echo
	@$(BIN)/waypost status
	@echo
	@echo "Report: $$(pwd)/results/_all/sample/report/report.md (and report.html)"

# As root (CI), install Debian's chromium for the status page test, rclone
# and fuse3 for the mounted-bucket tests (a FUSE mount of the GCS emulator),
# strace for the test that each line the step runner says is one write,
# and start the local Slurm cluster the Slurm tests use (installs munge,
# Slurm and MariaDB on first use); elsewhere those tests skip.
test: profiles
	@if [ "$$(id -u)" = 0 ]; then \
	    [ -x /usr/bin/chromium ] || { echo "installing chromium (for the status page test)"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || exit 1; \
	    { command -v rclone >/dev/null && command -v fusermount3 >/dev/null; } || { echo "installing rclone and fuse3 (for the mounted-bucket tests)"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rclone fuse3 >/dev/null; } || exit 1; \
	    command -v strace >/dev/null || { echo "installing strace (to see the step runner's writes)"; \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace >/dev/null; } || exit 1; \
	    bash scripts/slurm-dev-cluster.sh start; \
	else echo "not root: the Slurm tests will be skipped"; fi
	$(MAKE) --no-print-directory lint docs-build
	bash tests/run.sh $(BIN)/python $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .

# The manual (mkdocs.yml, docs/): built strictly, so a broken link, a missing
# page or anchor, or a schema key without a description fails.
export NO_MKDOCS_2_WARNING := 1
docs-build: venv
	$(BIN)/mkdocs build --strict --site-dir site 2>&1 | grep -v "^INFO" ; test $${PIPESTATUS[0]} = 0

# The reference pages (docs/reference/config.md, cli.md) are committed with
# their generated tables: this makes them again from the code (a docs build
# does too, and fails in strict mode when it had to: commit them).
reference: venv
	$(BIN)/python docs/hooks.py

# Serve it at http://127.0.0.1:8000 while you edit it.
docs: venv
	$(BIN)/mkdocs serve

# The parameter-study example (restarts, reruns, a funnel over failures).
param-study: venv
	cd examples/param-study && ../../$(BIN)/snakemake --profile ../../profiles/local
	@cat examples/param-study/results/_all/sweep/summary_report/summary.md

# The translation example (checkpoint splits, part × teacher, a report per experiment).
translation: venv
	cd examples/translation && ../../$(BIN)/snakemake --profile ../../profiles/local
	@cat examples/translation/results/_all/*/report/report.md

# Benchmarks (issue 8): waypost's cost over plain Snakemake; rewrites
# docs/benchmarks.md. BENCH_SLURM=0 skips the Slurm part (see benchmarks/run.py).
bench: venv
	$(BIN)/python benchmarks/run.py
