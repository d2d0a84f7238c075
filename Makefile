# Two commands on a fresh machine: `make demo` and `make test`. Everything else is set up on the way.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: setup model browser test pythons demo lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
	$(PY) -c "import torch, transformers, celery, s3fs, triton; assert torch.__version__.startswith('2.13.0')"
	touch $(STAMP)

setup: $(STAMP)

model: setup
	$(PY) -m engine.model_registry  # the default model

# The dashboard test drives Debian's chromium through Playwright (never `playwright install`).
# If it cannot be installed here, that test fails and says so.
browser:
	@command -v chromium >/dev/null || { APT="$$( [ "$$(id -u)" = 0 ] || echo sudo -n ) env DEBIAN_FRONTEND=noninteractive apt-get"; \
	  $$APT install -y chromium || { $$APT update && $$APT install -y chromium; }; } \
	  || echo "WARNING: could not install chromium; tests/service/test_service_dashboard.py will fail" >&2

test: model browser
	$(PY) -m pytest -q -ra tests

# Python 3.12 and 3.13: the project installed from this tree into fresh venvs (constraints.txt's
# versions), then the torch-free test subset (no CPU torch for them is reachable here; see the script).
pythons:
	.ci/other-pythons

demo: model
	$(VENV)/bin/tokenmill run examples/demo/summarize.toml

lint: setup
	$(VENV)/bin/ruff check engine connectors pipeline jobs service harness cli tests bench

bench: model
	$(PY) bench/bench_engine.py

clean:
	rm -rf $(VENV) .pytest_cache demo-output build/other-pythons
