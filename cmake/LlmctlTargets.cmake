# Helpers every folder uses: warnings as errors for project code only, and one test per file.

# Project code compiles with warnings as errors; third-party headers come in as SYSTEM includes
# (imported targets' include directories are SYSTEM by default), so their warnings never fail the build.
# LLMCTL_WERROR=OFF keeps the warnings but not the failure: deploy/gpu-check builds with it, on a machine
# whose compiler (GCC 13 there) finds warnings this project's does not, some of them false positives in
# libstdc++'s own inlined code (-Warray-bounds in std::vector's memmove at -O3).
option(LLMCTL_WERROR "Treat the project's compiler warnings as errors" ON)
function(llmctl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wno-unused-parameter)
  if(LLMCTL_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# LibTorch's <torch/torch.h> is about 40 s of parsing per translation unit on this project's 2-core
# machines. Every target that compiles against it reuses one precompiled copy (llmctl_torch_pch, in
# trainer/): the header is compiled once per build instead of once per test binary. GCC takes the PCH
# only when the reusing target's flags match it (same warnings, no -D the PCH has and the target
# lacks); CMake adds -Winvalid-pch, which -Werror turns into a build error where they would not.
function(llmctl_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM llmctl_torch_pch)
endfunction()

# llmctl_library(NAME [TORCH] [UNITY] SOURCES ... DEPS ...)
# TORCH: the sources include LibTorch (they reuse its precompiled header).
# UNITY: the sources compile in batches of up to 8, one translation unit each: for libraries whose
# files spend most of their time in the same heavy headers (gRPC, Protobuf, nlohmann-json, yaml-cpp),
# parsed once per batch instead of once per file. Names in anonymous namespaces must then differ
# across the library's files. Not for LibTorch libraries: there the precompiled header already
# removes the parsing, and a batch would make editing one file recompile its neighbours.
function(llmctl_library name)
  cmake_parse_arguments(ARG "TORCH;UNITY" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
  llmctl_warnings(${name})
  if(ARG_TORCH)
    llmctl_torch_pch(${name})
  endif()
  if(ARG_UNITY)
    set_target_properties(${name} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  endif()
endfunction()

# llmctl_test(NAME [TORCH] [DEVICE] SOURCES ... DEPS ... [ENV k=v ...] [ONE_PROCESS] [WAITS] [SERIAL]
#             [COST S])
# Tests are discovered when ctest runs (not at build time), with a fixed thread count so results and
# timings do not depend on the machine's core count. A test binary's main is tests/support/
# gtest_main.cc: it exits kSkippedExitCode (77, SKIP_RETURN_CODE below) only when nothing failed and
# a GTEST_SKIP ran, so a failure in a skipped suite's set-up or tear-down stays a failure, and it
# prints each skip's reason, which `make test` lists and checks against tests/expected-skips.txt.
# ONE_PROCESS: one ctest test runs all of the binary's tests in one process, for suites that share an
# expensive fixture (a real Keystone). A skip then marks the whole ctest test skipped. TORCH: as for
# llmctl_library. DEVICE: built in the trainer-only configuration too, when it finds GoogleTest
# (deploy/gpu-check's kernels stage). COST: about the seconds the binary's slowest test takes on two
# cores without AVX-512, given to each of its tests, so that ctest -j starts them first in a fresh
# clone too: ctest's own cost data (build/Testing/Temporary/CTestCostData.txt) holds 0 for a test that
# skipped and for a parameterized one (its name holds spaces), which it would then start last.
# Slots (ctest's PROCESSORS) are the cores a test keeps busy: an llmctl_test takes two, the two
# OpenMP threads it runs (below). WAITS marks one that spends most of its time waiting on a service
# rather than computing (the live Blazar's leases start at a minute boundary): it takes one, as do
# the single-threaded fuzz replays and script checks, so that `make test` (ctest -j with two slots a
# computing test and one more: Makefile) runs it beside as many computing tests as without it
# rather than in the place of one. SERIAL marks one that measures this machine's speed (llm-train
# --probe, which refuses its rates when other processes shared its CPUs: trainer/train/rate_probe.h):
# ctest runs it alone (RUN_SERIAL).
set(LLMCTL_TEST_SKIP_RETURN_CODE 77)
# ctest runs tests side by side (make test: -j 2), each with two OpenMP threads and some with two
# ranks, so there are more threads than cores. OpenMP's default lets an idle thread spin for its
# next task, burning the core another test's thread waits for: a training test ran 6x slower next to
# a twin than passive waiting lets it (docs/developing.md, "Time budgets"). Passive waiting changes
# no result: the threads and their work are the same.
# GLIBC_TUNABLES: glibc's malloc keeps what a process frees for its next allocation instead of
# unmapping it (mmap_max 0: every block from the heap; trim_threshold 64 GiB: the heap never
# shrinks), so a training step's tensors reuse the previous step's pages rather than fault fresh
# zeroed ones in: qwen2-0.5b's shape check spent 20.7 s of 71 in the kernel, 4.7 s of 58 with it.
# The counting allocator's figures are the same bytes either way (it counts what LibTorch asks
# for); only the processes' resident memory stays at its high-water mark until they exit. llm-train
# sets the same policy itself since 11-30 (trainer/memory/host_heap.h); this covers every other test
# process.
# LLMCTL_RATE_PROBE=off: an llmctl a test starts predicts at the data sheets' rates, never at a
# probe of this machine (its speed, and 10 s of two cores per fresh data directory); the probe's
# own tests pass their environment explicitly. A test binary run on its own, without it, measures
# (about 12 s in each fresh data directory) and runs slower, and its tests pass all the same: none
# checks what depends on the rates (docs/developing.md).
# LLMCTL_SOURCE_DIR and LLMCTL_BUILD_DIR: the two trees, absolute, where the tests find their files
# and the built binaries they start. A binary run on its own sets both itself, from where it lies
# (tests/support/gtest_main.cc), so that it finds them as it does here.
set(LLMCTL_TEST_ENVIRONMENT OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
  GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736
  LLMCTL_RATE_PROBE=off LLMCTL_SOURCE_DIR=${PROJECT_SOURCE_DIR} LLMCTL_BUILD_DIR=${PROJECT_BINARY_DIR})
function(llmctl_test name)
  cmake_parse_arguments(ARG "ONE_PROCESS;TORCH;DEVICE;WAITS;SERIAL" "COST" "SOURCES;DEPS;ENV" ${ARGN})
  if(NOT DEFINED ARG_COST)
    set(ARG_COST 0)
  endif()
  set(slots 2)
  if(ARG_WAITS)
    set(slots 1)
  endif()
  # The trainer-only build (a lent GPU machine's) has only the DEVICE tests, where GoogleTest is
  # found; the others run in the full build.
  if(LLMCTL_TRAINER_ONLY AND NOT (ARG_DEVICE AND GTest_FOUND))
    return()
  endif()
  if(NOT TARGET llmctl_gtest_main)
    add_library(llmctl_gtest_main STATIC ${PROJECT_SOURCE_DIR}/tests/support/gtest_main.cc)
    target_link_libraries(llmctl_gtest_main PUBLIC GTest::gtest)
    llmctl_warnings(llmctl_gtest_main)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest llmctl_gtest_main)
  llmctl_warnings(${name})
  if(ARG_TORCH)
    llmctl_torch_pch(${name})
  endif()
  set(environment ${LLMCTL_TEST_ENVIRONMENT} ${ARG_ENV})
  if(ARG_ONE_PROCESS)
    add_test(NAME ${name} COMMAND ${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${name} PROPERTIES
      ENVIRONMENT "${environment}"
      SKIP_RETURN_CODE ${LLMCTL_TEST_SKIP_RETURN_CODE}
      COST ${ARG_COST}
      PROCESSORS ${slots}
      RUN_SERIAL ${ARG_SERIAL})
    return()
  endif()
  # PRE_TEST discovery passes PROPERTIES through three list expansions (gtest_discover_tests' own
  # argument parsing, the generated include file's call, and the per-test set_tests_properties it
  # writes); each splits on a bare ";" and halves the backslashes before an escaped one. Unescaped,
  # ENVIRONMENT keeps only the first variable and the others become property names; seven
  # backslashes arrive as one ";" between two variables.
  string(REPLACE ";" "\\\\\\\\\\\\\\;" discovered_environment "${environment}")
  # DISCOVERY_TIMEOUT: listing a torch-linked binary's tests loads libtorch (about 0.5 GiB); the
  # first such load after a fresh clone's build reads it from disk, which took 5.5 s here, over
  # CMake's 5 s default, and a timed-out listing fails the whole ctest run before any test runs.
  gtest_discover_tests(${name}
    DISCOVERY_MODE PRE_TEST
    DISCOVERY_TIMEOUT 300
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES
      ENVIRONMENT "${discovered_environment}"
      SKIP_RETURN_CODE ${LLMCTL_TEST_SKIP_RETURN_CODE}
      COST ${ARG_COST}
      PROCESSORS ${slots}
      RUN_SERIAL ${ARG_SERIAL})
endfunction()

# llmctl_test_rerun(NAME TARGET t FILTER f TESTS n ENV k=v ... [COST S]): the gtest cases of test
# binary `t` that `f` (--gtest_filter) selects, once more as the one ctest test NAME with the tests'
# environment plus ENV; it passes only if all `n` of them ran and passed and the binary exited 0
# (tests/support/gtest_main.cc's --llmctl_expect_tests), so a filter that stops matching, a skip or
# a crash after the last test fails rather than passing with less checked. Issue 37: comparisons under another CPU's
# kernels (ATEN_CPU_CAPABILITY=default), docs/developing.md.
function(llmctl_test_rerun name)
  if(LLMCTL_TRAINER_ONLY)
    return()
  endif()
  cmake_parse_arguments(ARG "" "TARGET;FILTER;TESTS;COST" "ENV" ${ARGN})
  if(NOT DEFINED ARG_COST)
    set(ARG_COST 0)
  endif()
  add_test(NAME ${name}
           COMMAND ${ARG_TARGET} --gtest_filter=${ARG_FILTER} --llmctl_expect_tests=${ARG_TESTS}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES
    ENVIRONMENT "${LLMCTL_TEST_ENVIRONMENT};${ARG_ENV}"
    COST ${ARG_COST}
    PROCESSORS 2)
endfunction()

# llmctl_fuzz_replay(NAME DEPS ... [MUTATIONS N] [SEED S]): replays tests/fuzz/corpus/NAME through
# tests/fuzz/NAME_fuzz.cc's LLVMFuzzerTestOneInput with a plain main() (tests/fuzz/replay_main.cc),
# so every test run covers the inputs that once crashed or reached new code, then runs N seeded
# mutations of them (default 20000; sized so a target takes a few seconds here), with the tokens of
# tests/fuzz/NAME_fuzz.dict where it exists. The same seed each run: a failure reproduces with the
# command it prints, and its input is written to the target's build folder. The libFuzzer builds
# themselves are manual: each fuzz file says how.
function(llmctl_fuzz_replay name)
  if(LLMCTL_TRAINER_ONLY)
    return()
  endif()
  cmake_parse_arguments(ARG "" "MUTATIONS;SEED" "DEPS" ${ARGN})
  if(NOT DEFINED ARG_MUTATIONS)
    set(ARG_MUTATIONS 20000)
  endif()
  if(NOT DEFINED ARG_SEED)
    set(ARG_SEED 1)
  endif()
  add_executable(${name}_fuzz_replay
    ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.cc
    ${PROJECT_SOURCE_DIR}/tests/fuzz/replay_main.cc)
  target_link_libraries(${name}_fuzz_replay PRIVATE ${ARG_DEPS})
  target_compile_definitions(${name}_fuzz_replay PRIVATE LLMCTL_FUZZ_NAME="${name}")
  llmctl_warnings(${name}_fuzz_replay)
  set(dictionary_option)
  if(EXISTS ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.dict)
    set(dictionary_option --dict ${PROJECT_SOURCE_DIR}/tests/fuzz/${name}_fuzz.dict)
  endif()
  add_test(NAME ${name}_fuzz_replay
    COMMAND ${name}_fuzz_replay --mutations ${ARG_MUTATIONS} --seed ${ARG_SEED} ${dictionary_option}
      --crash-dir ${CMAKE_CURRENT_BINARY_DIR} ${PROJECT_SOURCE_DIR}/tests/fuzz/corpus/${name})
endfunction()
