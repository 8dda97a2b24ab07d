# dtrain — every target installs dependencies first (scripts/setup, idempotent).
# Quick start: `make demo`, then `make test`.
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
TORCH_PREFIX = $$(cat $(BUILD)/.torch-prefix)

.PHONY: all setup build test demo bench asan check-long clean

all: build

# setup, build and test each write their wall time to $(BUILD)/.seconds-*, and
# `make test` ends with the three side by side (issue 37).
setup:
	@start=$$(date +%s); BUILD_DIR=$(BUILD) scripts/setup || exit 1; \
	echo $$(( $$(date +%s) - start )) > $(BUILD)/.seconds-setup

# Prints the build's wall time last, so a slower build shows in every run
# (CI's included); `make test` then ends with setup, build and test times.
#
# A new build folder uses Ninja where it is installed (scripts/setup installs
# it): it keeps every core busy to the last link, where make's recursive
# per-directory targets leave one idle. A folder keeps the generator it was
# first configured with (CMake refuses to switch).
GENERATOR = $$(test -f $(BUILD)/CMakeCache.txt || ! command -v ninja >/dev/null || echo "-G Ninja")
build: setup
	@start=$$(date +%s); \
	cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_PREFIX_PATH="$(TORCH_PREFIX)" >$(BUILD)/cmake-configure.log || { cat $(BUILD)/cmake-configure.log; exit 1; }; \
	grep "^-- dtrain:" $(BUILD)/cmake-configure.log || true; \
	cmake --build $(BUILD) -j $(JOBS) || exit 1; \
	seconds=$$(( $$(date +%s) - start )); echo $$seconds > $(BUILD)/.seconds-build; \
	echo "build: $$seconds s (configure and compile, $(JOBS) jobs)"

# Every test but those labelled "long" (tests/test_tiers.cmake: the rest of
# each matrix, which `make check-long` runs), $(JOBS) at a time: a multi-rank
# test holds as many processors as it has ranks (its PROCESSORS), so the ranks
# running at once never outnumber the cores.
# Ends with the skipped tests and why (no GPU, not root), one line with the
# counts: "tests: P passed, F failed, S skipped" (tests/ctest_summary.py), and
# the wall time of setup, build and tests.
CTEST = ctest --output-on-failure --timeout 600 -j $(JOBS)
test: build
	@cd $(BUILD) && rm -f ctest-junit.xml && status=0 && start=$$(date +%s) && \
	$(CTEST) -LE long --output-junit ctest-junit.xml || status=$$?; \
	python3 $(CURDIR)/tests/ctest_summary.py ctest-junit.xml; \
	echo "make test: setup $$(cat .seconds-setup) s, build $$(cat .seconds-build) s, tests $$(( $$(date +%s) - start )) s"; \
	exit $$status

# A byte-level GPT (0.8M parameters) learns the fortunes corpus on the local
# cores (FSDP over min(4, cores) ranks): about 3 minutes on a 2-core machine.
# The loss falls from 5.5 to about 1.7 and three samples print at the end.
demo: build
	$(BUILD)/bin/dtrain train --model gpt --strategy fsdp --gpt-layers 4 --gpt-dim 128 --gpt-heads 4 --seq-len 128 \
	    --batch-size 16 --steps 2000 --lr 3e-3 --warmup 100 --grad-clip 1 --eval-every 500 --log-every 100 \
	    --metrics $(BUILD)/demo-metrics.jsonl

# About 15 minutes on 2 cores (bench/run_all.sh): the collectives, DDP, FSDP
# (memory and speed) and straggler benchmarks, results in bench/results/, then
# the plots (docs/img/) and the tables of docs/PERFORMANCE.md rewritten from them.
# As root it also runs the shaped-network part (bench/network.sh, two hosts as
# network namespaces; 23 more minutes under a load average of 9). PARTS="ddp ps" reruns only those parts (bench/run_all.sh
# lists them); PARTS=network only the shaped-network one.
bench: build
	BUILD=$(BUILD) bench/run_all.sh $(PARTS)

# Redraws docs/img/*.png (gnuplot) and rewrites docs/PERFORMANCE.md's generated
# tables from the JSON already in bench/results/; needs no build. A missing
# results file skips its plot or table with a note.
.PHONY: plots report
plots:
	python3 bench/plot.py
report:
	python3 bench/report.py

asan:
	@BUILD_DIR=$(ASAN_BUILD) scripts/setup
	cmake -S . -B $(ASAN_BUILD) -DDTRAIN_ASAN=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_PREFIX_PATH="$$(cat $(ASAN_BUILD)/.torch-prefix)"
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	# LibTorch and OpenMPI are not instrumented: their one-time allocations look
	# like leaks and std::vector annotations cross the boundary, hence the options.
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0 ctest --output-on-failure --timeout 900

# First the 77 tests `make test` leaves out (label "long", tests/test_tiers.cmake;
# 945 s of test time on 2 cores), then training to accuracy and throughput
# (issue 5): about 6 minutes; then check-multihost's and check-fresh-machine's
# checks, and the GPU kit built and run dry on this machine
# (tests/long/check_gpu_kit.sh, ~25 min).
check-long: build
	cd $(BUILD) && rm -f ctest-junit-long.xml && status=0 && \
	$(CTEST) -L long --output-junit ctest-junit-long.xml || status=$$?; \
	python3 $(CURDIR)/tests/ctest_summary.py ctest-junit-long.xml; exit $$status
	BUILD=$(BUILD) tests/long/check_long.sh
	BUILD=$(BUILD) tests/multihost/run_two_hosts.sh
	BUILD=$(BUILD) tests/multihost/run_elastic.sh
	BUILD=$(BUILD) tests/fresh_machine/check_fresh_machine.sh
	BUILD=$(BUILD) tests/long/check_gpu_kit.sh

# A newcomer's machine (issue 14): a bare Debian 12 root (debootstrap minbase
# plus g++, cmake, make, git, python3-pip, python3-venv, ca-certificates; no
# CUDA toolkit) clones the committed HEAD and runs `make test`; fails if
# anything fails. Needs root (else prints SKIP and passes) and the package
# registries; about 17 minutes on 2 cores (README, "Build time").
.PHONY: check-fresh-machine
check-fresh-machine:
	BUILD=$(BUILD) tests/fresh_machine/check_fresh_machine.sh

# Two hosts as network namespaces on this machine (issue 6): a 2-host x 2-rank
# job over TCP (mpi and c10d) equals the single-host run; a cut link ends it
# within DTRAIN_TIMEOUT and it resumes from its checkpoint; an elastic job
# (--nproc 2:4) loses a host, goes on with the other, and grows back when it
# returns (run_elastic.sh, which make test also runs). Needs root (else it
# prints SKIP and passes); about 3 minutes on 2 cores.
.PHONY: check-multihost
check-multihost: build
	BUILD=$(BUILD) tests/multihost/run_two_hosts.sh
	BUILD=$(BUILD) tests/multihost/run_elastic.sh

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

# libFuzzer on the two parsers of untrusted checkpoint files, which do not use
# LibTorch: the safetensors header (src/checkpoint/safetensors_format.cpp) and
# the sharded checkpoint's manifest.json (src/checkpoint/manifest.cpp). Built
# with clang, ASan and UBSan; each runs FUZZ_SECONDS from its committed corpus
# (tests/checkpoint/fuzz_corpus/, fuzz_corpus_manifest/). Inputs it finds
# collect in $(FUZZ_BUILD)/corpus-NAME (kept between runs); then the ones
# reaching the most code the hand-made seeds do not are saved in the committed
# corpus, at most FUZZ_CORPUS_MAX files each (tests/checkpoint/trim_fuzz_corpus.py).
# A crashing input is saved as $(FUZZ_BUILD)/crash-* and fails the target; the
# committed corpora are replayed by checkpoint.safetensors.Malformed and
# checkpoint.manifest.FuzzCorpus.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 300
FUZZ_CORPUS_MAX ?= 50
FUZZ_FLAGS = -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Wall -Wextra -Isrc -Iinclude
# $(call run_fuzzer,NAME,CORPUS,EXTRA_OPTIONS[,MAX_LEN])
define run_fuzzer
	@mkdir -p $(FUZZ_BUILD)/corpus-$(1)
	$(FUZZ_BUILD)/fuzz_$(1) -max_len=$(or $(4),4096) -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 $(3) \
	    -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus-$(1) $(2)
	@rm -rf $(FUZZ_BUILD)/merged $(FUZZ_BUILD)/merge.txt && mkdir -p $(FUZZ_BUILD)/merged
	@$(FUZZ_BUILD)/fuzz_$(1) -merge=1 -use_counters=0 -max_len=$(or $(4),4096) -merge_control_file=$(FUZZ_BUILD)/merge.txt \
	    $(FUZZ_BUILD)/merged $(2) $(FUZZ_BUILD)/corpus-$(1) 2>$(FUZZ_BUILD)/merge.log
	@python3 tests/checkpoint/trim_fuzz_corpus.py $(FUZZ_BUILD)/merge.txt $(2) $(FUZZ_CORPUS_MAX)
endef
.PHONY: fuzz
fuzz:
	@DTRAIN_SETUP_FUZZ=1 BUILD_DIR=$(FUZZ_BUILD) scripts/setup
	clang++ $(FUZZ_FLAGS) src/checkpoint/safetensors_format.cpp tests/checkpoint/fuzz_safetensors.cpp \
	    -o $(FUZZ_BUILD)/fuzz_safetensors
	clang++ $(FUZZ_FLAGS) src/checkpoint/manifest.cpp src/common/strategy_table.cpp tests/checkpoint/fuzz_manifest.cpp -lxxhash \
	    -o $(FUZZ_BUILD)/fuzz_manifest
	$(call run_fuzzer,safetensors,tests/checkpoint/fuzz_corpus,-dict=tests/checkpoint/fuzz_safetensors.dict)
	$(call run_fuzzer,manifest,tests/checkpoint/fuzz_corpus_manifest,)

# libFuzzer on the whole load path (tests/checkpoint/fuzz_load.cpp): mutated
# checkpoints (manifest and rank files) loaded into a live model and AdamW
# optimizer by load_checkpoint, then read whole. The library is rebuilt with
# clang, coverage, ASan and UBSan in $(FUZZ_BUILD)/load (once: 5.5 minutes
# on 2 cores with a warm ccache of nothing, then incremental). LibTorch is not instrumented, hence
# the ASan options (as in `make asan`). Runs FUZZ_SECONDS from the committed
# corpus tests/checkpoint/fuzz_corpus_load/ (replayed by checkpoint.load.fuzz_corpus).
.PHONY: fuzz-load
fuzz-load:
	@DTRAIN_SETUP_FUZZ=1 BUILD_DIR=$(FUZZ_BUILD)/load scripts/setup
	cmake -S . -B $(FUZZ_BUILD)/load -DCMAKE_CXX_COMPILER=clang++ -DDTRAIN_FUZZ=ON -DDTRAIN_BUILD_TESTS=OFF \
	    -DDTRAIN_CUDA=OFF -DCMAKE_PREFIX_PATH="$$(cat $(FUZZ_BUILD)/load/.torch-prefix)"
	cmake --build $(FUZZ_BUILD)/load -j $(JOBS) --target fuzz_load
	cp $(FUZZ_BUILD)/load/bin/fuzz_load $(FUZZ_BUILD)/fuzz_load
	ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0 $(MAKE) --no-print-directory fuzz-load-run
.PHONY: fuzz-load-run
fuzz-load-run:
	$(call run_fuzzer,load,tests/checkpoint/fuzz_corpus_load,-timeout=20,16384)
