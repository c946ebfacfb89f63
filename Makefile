# specfinops: every target installs what it needs first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DB      ?= sqlite:///var/specfinops.db
PORT    ?= 8501

.PHONY: install demo test bench lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# CPU build of torch first (on disk here), so nothing pulls a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	@command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "chromium not installed: browser tests will skip"
	touch $(STAMP)

demo: install
	mkdir -p var
	$(BIN)/specfinops models pull
	# the modes take turns every 2 prompts, so a VM whose speed drifts slows both alike
	$(BIN)/specfinops bench --workload code --mode both --limit 4 --interleave 2 --max-new-tokens 64 --db $(DB)
	$(BIN)/specfinops dashboard --db $(DB) --port $(PORT)

test: install
	$(BIN)/specfinops models pull
	$(BIN)/pytest -q

bench: install
	$(BIN)/specfinops models pull
	$(BIN)/python -m scripts.bench_all

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) var .pytest_cache
