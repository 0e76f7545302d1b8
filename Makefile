# Thin wrapper over CMake and ctest.  `make run` and `make test` install the
# Debian packages they need first (deploy/install-deps.sh).
BUILD ?= build
JOBS ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all deps test-deps build build-only install dist image image-test run stop status test unit test-asan soak-copies flood-router bench clean

all: build

# Build dependencies only; the test target adds what the tests run against.
deps:
	@./deploy/install-deps.sh build

test-deps:
	@./deploy/install-deps.sh test

build: deps
	@$(MAKE) --no-print-directory build-only

build-only:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Install the programs, units, examples, docs and manual pages under PREFIX
# (DESTDIR=... stages the install for packaging).
PREFIX ?= /usr/local
install: build
	@cmake -S . -B $(BUILD) -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)
	@cmake --install $(BUILD)

# A relocatable tarball of the programs with every library they need, for
# machines without them (Hadoop, Spark): deploy/dist/README.md.
dist: build
	@./deploy/dist/make-dist.sh $(BUILD)

# The container image (Dockerfile; deploy/image/README.md), and a run of it.
image:
	@./deploy/install-deps.sh image
	@./deploy/image/build.sh

# PORTS=NODE,NODE_HEALTH,ROUTER,ROUTER_HEALTH: the loopback ports it uses
# (free ones otherwise); IMAGE=NAME another image (deploy/image/test.sh).
image-test:
	@./deploy/install-deps.sh image
	@./deploy/image/test.sh $(if $(PORTS),--ports $(PORTS)) $(IMAGE)

run: build
	@./deploy/run.sh $(BUILD)

stop:
	@./deploy/local/stop.sh

status:
	@./deploy/local/status.sh

test: test-deps
	@$(MAKE) --no-print-directory build-only
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

unit: test-deps
	@$(MAKE) --no-print-directory build-only
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

# Unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer.
test-asan: test-deps
	@cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DBLOOMGRID_SANITIZE=ON >/dev/null
	@cmake --build $(BUILD)-asan -j $(JOBS)
	@cd $(BUILD)-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
		BLOOMGRID_FAST_TESTS=1 ctest --output-on-failure -j $(JOBS) -L unit

# The set test of copies (tests/integ/test_copies_set.c) for SOAK_S seconds
# with every fault; SEED=N replays a run's faults, SOAK_ARGS adds options
# (e.g. "--write-quorum 3 --read-quorum 1").
SOAK_S ?= 600
SOAK_ARGS ?=
soak-copies: test-deps
	@$(MAKE) --no-print-directory build-only
	@mkdir -p $(BUILD)/tests/integ/tmp
	@cd $(BUILD) && BLOOMGRID_TEST_TMP=$(CURDIR)/$(BUILD)/tests/integ/tmp \
		./tests/integ/test_copies_set node/bloomgrid-node router/bloomgrid-router \
		merger/bloomgrid-merger --duration $(SOAK_S) $(if $(SEED),--seed $(SEED)) $(SOAK_ARGS)

# The router's budgets at full size (about a minute, 2 GB of memory): 30
# concurrent 60 MB reads, 24 held Imports of 60 MiB, 2000 idle connections.
flood-router: test-deps
	@$(MAKE) --no-print-directory build-only
	@mkdir -p $(BUILD)/tests/router/tmp
	@cd $(BUILD) && BLOOMGRID_TEST_TMP=$(CURDIR)/$(BUILD)/tests/router/tmp \
		./tests/router/test_router_limits node/bloomgrid-node router/bloomgrid-router \
		flood_full

bench: test-deps
	@$(MAKE) --no-print-directory build-only
	@./$(BUILD)/bench/bench_engine

clean:
	rm -rf $(BUILD) $(BUILD)-asan
