# dtrain — every target installs dependencies first (scripts/setup, idempotent).
# Quick start: `make demo`, then `make test`.
SHELL := /bin/bash
BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
TORCH_PREFIX = $$(cat $(BUILD)/.torch-prefix)

.PHONY: all setup build test demo bench asan check-long clean

all: build

setup:
	@BUILD_DIR=$(BUILD) scripts/setup

build: setup
	@cmake -S . -B $(BUILD) -DCMAKE_PREFIX_PATH="$(TORCH_PREFIX)" >$(BUILD)/cmake-configure.log || { cat $(BUILD)/cmake-configure.log; exit 1; }
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600

# Until `dtrain train` exists the demo is a collectives run across local ranks.
demo: build
	$(BUILD)/bin/dtrain bench collectives --nproc 2 --max-bytes 16777216

# Results land in bench/results/ and, by hand with the command, in docs/PERFORMANCE.md.
bench: build
	@mkdir -p bench/results
	$(BUILD)/bin/dtrain bench collectives --nproc 2 --backend mpi --json bench/results/collectives-mpi-np2.json
	$(BUILD)/bin/dtrain bench collectives --nproc 2 --backend c10d --max-bytes 16777216 --json bench/results/collectives-c10d-np2.json

asan:
	@BUILD_DIR=$(ASAN_BUILD) scripts/setup
	cmake -S . -B $(ASAN_BUILD) -DDTRAIN_ASAN=ON -DCMAKE_BUILD_TYPE=Debug -DCMAKE_PREFIX_PATH="$$(cat $(ASAN_BUILD)/.torch-prefix)"
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	# LibTorch and OpenMPI are not instrumented: their one-time allocations look
	# like leaks and std::vector annotations cross the boundary, hence the options.
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=0:detect_container_overflow=0 ctest --output-on-failure --timeout 900

check-long: build
	@echo "check-long: no long checks yet (training to accuracy arrives with dtrain train)"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
