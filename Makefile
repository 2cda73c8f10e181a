# grpo: install, test and demo on a fresh machine. `make test` and `make demo` install what they need.
PYTHON ?= python3
VENV ?= .venv
# The CPU machine's torch; on a GPU machine use e.g. `make install TORCH_SPEC=torch EXTRAS=dev,liger`.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev
BIN := $(VENV)/bin
DEMO := outputs/demo

.PHONY: install test test-fast lint docs demo demo-gpu check-recipes clean

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

lint: install
	$(BIN)/ruff check .

# The key reference in docs/recipes.md, written from grpo_cli/arguments.py (tests/test_docs.py fails when it is stale).
docs: install
	$(BIN)/python -m grpo_cli.recipe.reference

check-recipes: install
	for r in $$($(BIN)/python -c "from grpo_cli.recipe import builtin_recipes; print(' '.join(builtin_recipes()))"); do \
		$(BIN)/grpo check -c $$r || exit 1; done

# The offline demo: SmolLM2-135M-Instruct learns Countdown's format on 2 CPU cores (about 10 minutes). Its GRPO step
# loads float32 weights, as the cold start does: bf16 autocast is the machine's (emulated bfloat16 is slow on a CPU).
demo: install
	$(BIN)/grpo models prepare smollm2-135m-instruct
	$(BIN)/grpo sft -c demo/countdown-sft --no-resume --overwrite
	$(BIN)/grpo rl -c demo/countdown-rl --model_name_or_path $(DEMO)/sft --dtype float32 --no-resume --overwrite
	$(BIN)/grpo merge --adapter $(DEMO)/rl --output $(DEMO)/merged --force
	$(BIN)/grpo eval -c demo/countdown-rl --model smollm2-135m-instruct --model $(DEMO)/sft --model $(DEMO)/merged \
		--dtype float32 \
		--limit 48 --batch-size 16 --output $(DEMO)/eval

# The same flow on one GPU, in the settings of the time-to-accuracy benchmark's SmolLM2 runs (docs/performance.md:
# 4000 generated problems, 200 held out, 64 completions of up to 192 tokens a step) on the 2-number problems of
# `make demo`: with 3-4 numbers the benchmark's steps moved this model within a standard error. Its table and
# timing on one H200 are in the README. Install with the GPU's torch:
# make demo-gpu TORCH_SPEC=torch EXTRAS=dev,liger
DEMO_GPU := outputs/demo-gpu
GPU_DATA := --use_cpu false --dataset_generate 4000 --dataset_test_size 200 --dataset_generate_numbers 2 2
demo-gpu: install
	$(BIN)/grpo models prepare smollm2-135m-instruct
	$(BIN)/grpo sft -c demo/countdown-sft $(GPU_DATA) --max_steps 16 --output_dir $(DEMO_GPU)/sft --no-resume --overwrite
	$(BIN)/grpo rl -c demo/countdown-rl $(GPU_DATA) --model_name_or_path $(DEMO_GPU)/sft --per_device_train_batch_size 64 \
		--max_completion_length 192 --learning_rate 5e-5 --temperature 1.0 --num_generations 8 \
		--reward_weights 0.5 1.0 --gradient_checkpointing true --max_steps 250 --save_steps 50 \
		--sample_every 50 --output_dir $(DEMO_GPU)/rl --no-resume --overwrite
	$(BIN)/grpo merge --adapter $(DEMO_GPU)/rl --output $(DEMO_GPU)/merged --force
	$(BIN)/grpo eval -c demo/countdown-rl $(GPU_DATA) --max_completion_length 192 --model smollm2-135m-instruct \
		--model $(DEMO_GPU)/sft --model $(DEMO_GPU)/merged --limit 200 --batch-size 64 --output $(DEMO_GPU)/eval
	$(BIN)/grpo report $(DEMO_GPU)/eval

clean:
	rm -rf outputs .pytest_cache
