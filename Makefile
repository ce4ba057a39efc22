# The README's two commands: `make demo` and `make test`.
# Both create .venv (or refresh it when the packaging files change) with a
# Python >= 3.12 found by scripts/find-python.sh.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# The native kickmsg 0.1.0 wheel, our interop and benchmark peer. It lives in
# its own directory and only ever runs in subprocesses (never vendored).
NATIVE := .native/kickmsg-0.1.0
NATIVE_INSTALLED := $(NATIVE)/.installed
# The native kickmsg 0.9.2 wheel, our layout-9 peer, likewise.
NATIVE9 := .native/kickmsg-0.9.2
NATIVE9_INSTALLED := $(NATIVE9)/.installed

.PHONY: demo test docs bench soak clean check-java

demo: $(INSTALLED) check-java
	$(PY) examples/demo.py

# The type checker (settings: [tool.mypy] in pyproject.toml), then the tests.
# The suite runs on the compiled build (kickmsg/build.py) on one core; beside
# it, on the other, the pure build (KICKMSG_PURE=1) runs the explorer's tests
# (which schedule the flows' source) and the protocol and interop tests again.
# Each test session names its shared-memory objects with a prefix of its own,
# so the two cannot meet. The pure run's report follows the suite's; a
# failure of either fails `make test`, and a stop ends both.
PURE_TESTS := tests/verify tests/protocol tests/interop
EXPLORER_TESTS := tests/verify
test: $(INSTALLED) $(NATIVE_INSTALLED) $(NATIVE9_INSTALLED) check-java
	@log=$$(mktemp); \
	KICKMSG_PURE=1 $(PY) -m pytest -p no:cacheprovider $(PURE_TESTS) > $$log 2>&1 & beside=$$!; \
	trap 'kill $$beside 2>/dev/null; rm -f $$log; exit 130' INT TERM; \
	$(PY) -m mypy && $(PY) -m pytest $(addprefix --ignore=,$(EXPLORER_TESTS)); status=$$?; \
	wait $$beside; beside_status=$$?; \
	echo "== the pure build's tests (explorer, protocol, interop), run beside the suite =="; cat $$log; rm -f $$log; \
	exit $$(( status || beside_status ))

# The documentation site (mkdocs.yml, pages in docs/) into site/, in strict
# mode: a broken link, anchor or API reference fails it. `make test` builds it
# too (tests/docs/test_docs.py); .github/workflows/docs.yml publishes it.
docs: $(INSTALLED)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Ours (the compiled build) on layouts 4 and 9, native 0.1.0 and 0.9.2,
# multiprocessing.Pipe/Queue, pyzmq, faster-fifo, iceoryx2 and zenoh, same run,
# about 5 minutes on 2 cores, with issue 37's targets met or missed on both
# layouts; then the pure build (KICKMSG_PURE=1) against native and mp.Pipe,
# with the same targets, about 3 minutes; then waiting (asyncio, WaitSet)
# against pyzmq, about a minute; then two Zenoh bridges on loopback against
# pyzmq PUB/SUB, under a minute; results in benchmarks/results/. Smoke run:
# make bench BENCH_ARGS=--quick
bench: $(INSTALLED) $(NATIVE_INSTALLED) $(NATIVE9_INSTALLED)
	status=0; \
	$(PY) benchmarks/bench_core.py $(BENCH_ARGS) || status=$$?; \
	$(PY) benchmarks/bench_core.py --pure --peers ours,ours9,native,native9,mp_pipe $(BENCH_ARGS) || status=$$?; \
	$(PY) benchmarks/bench_wait.py $(BENCH_ARGS) || status=$$?; \
	$(PY) benchmarks/bench_bridge.py $(BENCH_ARGS) || status=$$?; \
	exit $$status

# The compiled build's sources (setup.py's COMPILED: each module with a .pxd
# beside it, and the shim's declarations): an edit rebuilds it.
COMPILED_PXD := $(wildcard kickmsg/*.pxd kickmsg/protocol/*.pxd kickmsg/protocol/*/*.pxd)
COMPILED_SOURCES := $(COMPILED_PXD) $(filter-out kickmsg/_shim.py,$(COMPILED_PXD:.pxd=.py))
$(INSTALLED): setup.py pyproject.toml kickmsg/_atomics.c kickmsg/_futex.c kickmsg/_build.py scripts/find-python.sh $(COMPILED_SOURCES)
	@python=$$(scripts/find-python.sh) || exit 1; \
	if ! $(PY) -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then \
		echo "creating $(VENV) with $$python"; rm -rf $(VENV) .native; $$python -m venv $(VENV) || exit 1; \
	fi
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --editable '.[test,docs,spark,bench,bridge,mcap,metrics]'
	touch $@

# Mixed traffic of both implementations with kills, then recovery and audit.
# Not part of `make test`: make soak SOAK_ARGS="--minutes 5 --json soak.json" (layout 9;
# SOAK_ARGS="--layout 4 ..." soaks layout 4)
soak: $(INSTALLED) $(NATIVE_INSTALLED) $(NATIVE9_INSTALLED)
	$(PY) scripts/soak.py $(SOAK_ARGS)

# Installed once per virtualenv (a new .venv removes .native), not on every
# refresh of our package: a `make test` running meanwhile keeps its peer.
$(NATIVE_INSTALLED): | $(INSTALLED)
	rm -rf $(NATIVE)
	$(PY) -m pip install --quiet --no-deps --target $(NATIVE) kickmsg==0.1.0
	touch $@

$(NATIVE9_INSTALLED): | $(INSTALLED)
	rm -rf $(NATIVE9)
	$(PY) -m pip install --quiet --no-deps --target $(NATIVE9) kickmsg==0.9.2
	touch $@

# PySpark 4 runs on Java 17 or newer.
check-java:
	@version=$$(java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1); \
	if [ -z "$$version" ] || [ "$$version" -lt 17 ]; then \
		echo "The Spark parts need Java 17 or newer (found: $${version:-no java on PATH})." >&2; \
		echo "Install one, e.g.: apt install openjdk-17-jre-headless" >&2; exit 1; \
	fi

clean:
	rm -rf $(VENV) build site *.egg-info kickmsg/_atomics_cffi*.so kickmsg/_futex_cffi*.so .native .pytest_cache .mypy_cache
