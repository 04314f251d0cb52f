# The two commands a newcomer types: `make demo` (the main job) and `make test` (the whole test suite).
# Each does whatever setup and build is still missing.
BUILD ?= build
VENV := .venv
TORCH_CMAKE = $(shell $(VENV)/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
TEST_JOBS ?= 2

.PHONY: setup configure build demo test bench readme-keys cpu-lab clean

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(TORCH_CMAKE)"

configure: $(BUILD)/build.ninja

build: setup configure
	cmake --build $(BUILD)

demo: build
	$(BUILD)/trainer/llm-train --config experiments/demo.yaml

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(TEST_JOBS)

# The labs' single-GPU table in miniature on the CPU (about 10 minutes on 2 cores): every trial of
# experiments/cpu-lab.yaml in turn, then the table of what each one measured (fails if a trial ends
# other than the file expects). LAB=other.yaml runs another experiment file the same way.
LAB ?= experiments/cpu-lab.yaml
LAB_DIR = $(BUILD)/lab/$(basename $(notdir $(LAB)))
cpu-lab: build
	@rm -rf $(LAB_DIR) && mkdir -p $(LAB_DIR)
	@$(BUILD)/trainer/llm-train --config $(LAB) --list > $(LAB_DIR)/trials.tsv
	@cut -f1 $(LAB_DIR)/trials.tsv | while read -r trial; do \
	  echo "== $$trial"; \
	  $(BUILD)/trainer/llm-train --config $(LAB) --trial $$trial --events $(LAB_DIR)/$$trial.jsonl \
	    > $(LAB_DIR)/$$trial.log 2>&1; \
	  grep -E '^\[(start|done|oom)\]' $(LAB_DIR)/$$trial.log; \
	done
	@python3 scripts/lab_table.py $(LAB_DIR)/trials.tsv $(LAB_DIR) | tee $(LAB_DIR)/table.md

# Regenerates the README's trial-key table from the registry (a test checks they agree).
readme-keys: build
	$(BUILD)/trainer/llm-train --keys > $(BUILD)/trial-keys.md
	python3 scripts/replace_between.py README.md '<!-- trial-keys:begin -->' '<!-- trial-keys:end -->' $(BUILD)/trial-keys.md

# Side-by-side benchmarks against the peers (not part of the tests; minutes on 2 cores).
bench: build
	$(VENV)/bin/python bench/run_train_bench.py --llm-train $(BUILD)/trainer/llm-train

clean:
	rm -rf $(BUILD)
