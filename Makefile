# One entry point for people and CI. Every target installs what it needs first, so the
# README's commands work on a fresh machine.
SHELL := /bin/bash
# The system tools the targets below look for (nft, debootstrap) live in /usr/sbin, which a PATH
# set by hand (sudo, env -i, a service manager) may lack: searched after the caller's PATH.
export PATH := $(PATH):/usr/sbin:/sbin
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo up test lint bench install browser image-tools acl nftables

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[tf,hub,kubernetes,dev]'
	# Optuna's GP sampler runs on PyTorch: the CPU build (a plain `torch` would pull CUDA).
	$(BIN)/pip install -q 'torch==2.13.0' 'scipy>=1.11'
	# TensorFlow Serving's config protos (the serving tests parse the registry's models.config
	# with them). --no-deps: it requires the `tensorflow` distribution, which would install
	# the CUDA build over tensorflow-cpu; tensorflow-cpu provides the same module.
	$(BIN)/pip install -q --no-deps 'tensorflow-serving-api>=2.16'
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the browser tests (Playwright drives it; no browser download).
browser:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# buildah (daemonless image builds, chroot isolation) and debootstrap (the stand-in base) for
# tests/test_images.py; see images/README.md.
# setfacl: as root, tunehub up lets people's own Unix users pass the directories above this
# Python (pyenv under /root) with an execute-only ACL entry; the tests do the same.
acl:
	@command -v setfacl >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq acl >/dev/null; }

# nft: as root, each local attempt's network island reaches the machine's network through source
# NAT, and nothing opens a connection into an island (tuner/backends/local/island.py).
nftables:
	@command -v nft >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }

image-tools:
	@command -v buildah >/dev/null && command -v debootstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null; }

demo: $(STAMP)
	$(BIN)/tunehub demo

up: $(STAMP) acl nftables
	$(BIN)/tunehub up

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP) browser image-tools acl nftables
	$(BIN)/ruff check .
	$(BIN)/mypy
	# Three workers, each running whole test files (a file's module fixtures, such as the image
	# build, stay in one process); the suite keeps no state between files. Three on 2 cores:
	# much of a test is waiting on processes it started (a hub, a trial), and with two the
	# cores were busy 71% of the time (37:46, the image cache cold: 8 of one worker's minutes);
	# with three 80% (27:41, the cache warm; 25:33 at the next commit). Every test waits on
	# conditions, never on time.
	$(BIN)/pytest -q -p no:cacheprovider -n 3 --dist loadfile --durations=25 tests kubesim/tests

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -m benchmarks
