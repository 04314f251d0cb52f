# The two commands a newcomer types: `make demo` (the main job) and `make test` (the whole test suite).
# Each does whatever setup and build is still missing.
BUILD ?= build
VENV := .venv
TORCH_CMAKE = $(shell $(VENV)/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)
# Computing tests side by side; ctest gets two slots for each and one more, for a test that mostly
# waits (WAITS in cmake/LlmctlTargets.cmake: a computing test takes two slots, a waiting one one).
TEST_JOBS ?= 2
TEST_SLOTS = $(shell echo $$((2 * $(TEST_JOBS) + 1)))

.PHONY: setup setup-tests configure build demo-build demo test thread-safety sanitize bench readme-keys clean

setup:
	@scripts/setup.sh

# What only the tests need besides: the real Keystone, cloud-init and shellcheck they check against.
setup-tests:
	@scripts/setup.sh --tests

$(BUILD)/build.ninja: CMakeLists.txt | setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$(TORCH_CMAKE)"

configure: $(BUILD)/build.ninja

build: setup configure
	cmake --build $(BUILD)

# The main job: the labs' single-GPU table in miniature (experiments/cpu-lab.yaml) submitted to the embedded
# controller and agent, followed live, then the report; fails if a trial ends other than the file expects.
# The daemons keep running afterwards (`$(LLMCTL) daemon stop` ends them); LLMCTL_HOME picks their data dir.
LLMCTL = $(BUILD)/controller/cli/llmctl
LAB ?= experiments/cpu-lab.yaml
# The demo needs four binaries, not the tests: building only them halves a cold `make demo`.
DEMO_TARGETS = llmctl_bin llmctld llm-agent llm-train
demo-build: setup configure
	cmake --build $(BUILD) --target $(DEMO_TARGETS)

demo: demo-build
	$(LLMCTL) submit $(LAB) --wait

# Fails when ctest does, or when a test skipped that tests/expected-skips.txt does not list; the ten
# slowest tests and every skipped one, with its reason, are printed after ctest either way, and last
# the failure lines of each failed test (the end of a log is what CI keeps).
test: setup-tests build
	@rc=0; ctest --test-dir $(BUILD) --output-on-failure -j $(TEST_SLOTS) \
	  --output-junit $(abspath $(BUILD))/ctest-results.xml || rc=$$?; \
	python3 scripts/slowest_tests.py $(BUILD)/ctest-results.xml 10; \
	python3 scripts/check_skips.py $(BUILD)/ctest-results.xml tests/expected-skips.txt || rc=1; \
	python3 scripts/failed_tests.py $(BUILD)/ctest-results.xml 40; \
	exit $$rc

# Clang's -Wthread-safety over the libraries without LibTorch (common, controller, agent, rpc): every
# LLMCTL_GUARDED_BY field touched only under its mutex, every LLMCTL_REQUIRES function called with it
# held. It reads the build's compile_commands.json and needs only the generated protobuf headers.
thread-safety: setup-tests configure
	cmake --build $(BUILD) --target llmctl_proto
	python3 scripts/thread_safety.py $(BUILD)

# AddressSanitizer, UndefinedBehaviorSanitizer and LeakSanitizer over every test that does not link
# LibTorch (the daemons', the CLI's, rpc/'s and common/'s, and the fuzz corpora's replays), in a build
# of its own; scripts/sanitize.py chooses and runs them, with the regular build's llm-train. Not part
# of `make test`: a second build, about 30 minutes on 2 cores. GCC 12 cannot evaluate the store's
# constexpr SQL checks with UBSan's null checks, so those three are off (ASan still stops a null
# dereference); its maybe-uninitialized warning, false under the sanitizers (inside std::regex), is
# off too.
SANITIZE_BUILD ?= build-sanitize
SANITIZE_FLAGS = -fsanitize=address,undefined -fno-sanitize=null,nonnull-attribute,returns-nonnull-attribute \
  -fno-sanitize-recover=undefined -fno-omit-frame-pointer -Wno-maybe-uninitialized
sanitize: build
	cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_PREFIX_PATH="$(TORCH_CMAKE)" -DCMAKE_CXX_FLAGS="$(SANITIZE_FLAGS)" \
	  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
	python3 scripts/sanitize.py $(SANITIZE_BUILD) --trainer-build $(BUILD)

# Regenerates docs/experiment-files.md's trial-key table from the registry (a test checks they agree).
readme-keys: build
	$(BUILD)/trainer/llm-train --keys > $(BUILD)/trial-keys.md
	python3 scripts/replace_between.py docs/experiment-files.md '<!-- trial-keys:begin -->' '<!-- trial-keys:end -->' $(BUILD)/trial-keys.md

# Side-by-side benchmarks against the peers (not part of the tests; minutes on 2 cores). The peers need
# transformers and tokenizers: setup's --dev installs them.
bench: build
	@scripts/setup.sh --dev
	$(VENV)/bin/python bench/run_train_bench.py --llm-train $(BUILD)/trainer/llm-train

clean:
	rm -rf $(BUILD)
