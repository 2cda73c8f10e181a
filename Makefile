# grpo: install, test and demo on a fresh machine. `make test` and `make demo` install what they need.
PYTHON ?= python3
VENV ?= .venv
# The CPU machine's torch; on a GPU machine use e.g. `make install TORCH_SPEC=torch EXTRAS=dev,liger`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
BIN := $(VENV)/bin
DEMO := outputs/demo

.PHONY: install test test-fast demo check-recipes clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

test: install
	$(BIN)/pytest -q

test-fast: install
	$(BIN)/pytest -q -m "not slow"

check-recipes: install
	for r in $$($(BIN)/python -c "from grpo_cli.recipe import builtin_recipes; print(' '.join(builtin_recipes()))"); do \
		$(BIN)/grpo check -c $$r || exit 1; done

# The offline demo: SmolLM2-135M-Instruct learns Countdown's format on 2 CPU cores (about 10 minutes).
demo: install
	$(BIN)/grpo models prepare smollm2-135m-instruct
	$(BIN)/grpo sft -c demo/countdown-sft --no-resume --overwrite
	$(BIN)/grpo rl -c demo/countdown-rl --model_name_or_path $(DEMO)/sft --no-resume --overwrite
	$(BIN)/grpo merge --adapter $(DEMO)/rl --output $(DEMO)/merged --force
	$(BIN)/grpo eval -c demo/countdown-rl --model smollm2-135m-instruct --model $(DEMO)/sft --model $(DEMO)/merged \
		--limit 48 --batch-size 16 --output $(DEMO)/eval

clean:
	rm -rf outputs .pytest_cache
