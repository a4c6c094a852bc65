# Two commands are all a fresh machine needs:
#   make lab   - set up .venv and open JupyterLab on lesson 00 (localhost only, token kept)
#   make test  - set up .venv and run the whole suite (what CI runs)
# Instructors add one:
#   make instructor - also install nbgrader (requirements-instructor.txt) and open JupyterLab with its
#                     formgrader on this course (nbgrader_config.py; docs/instructor_guide.md)
# Set-up is remembered by stamp files: a second run with unchanged requirements installs nothing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
LAB_STAMP  := $(VENV)/.stamp-lab
TEST_STAMP := $(VENV)/.stamp-test
INSTRUCTOR_STAMP := $(VENV)/.stamp-instructor
# Checks record progress; test runs keep theirs out of the maintainer's own record.
# Two test workers share two cores: one torch thread each avoids threads waiting on each other.
TEST_ENV := AMP_LESSONS_PROGRESS_FILE=$(CURDIR)/.test-output/progress.json PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
LAST_LESSON := $(lastword $(sort $(patsubst notebooks/%.ipynb,%,$(wildcard notebooks/[0-9][0-9]_*.ipynb))))
LAST_LESSON := $(firstword $(subst _, ,$(LAST_LESSON)))
NBVAL    := --nbval-lax --nbval-current-env --nbval-cell-timeout=300 -n 2 --dist loadfile

.PHONY: lab test setup setup-test instructor lint format format-check unit integration coverage notebooks \
        test-notebooks exercises-check lesson gpu-report clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch: on Linux, PyPI's torch is the CUDA build (0.55 GB) and pip adds 2.2 GB of nvidia-* wheels, GPU or not.
# So on Linux without an NVIDIA driver (no nvidia-smi, no /proc/driver/nvidia) set-up first installs the CPU build
# from the PyTorch CPU wheel index, TORCH_CPU_INDEX (a 1.4 GB venv instead of 5.8 GB). Where that index cannot be
# reached, it says so in one line and pip installs PyPI's torch as it would without this step. TORCH_BUILD=cpu or
# TORCH_BUILD=cuda forces either (cpu: install from the index or fail); a venv that has torch already keeps it.
TORCH_BUILD     ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
NVIDIA_FOUND := $(shell { command -v nvidia-smi || ls -d /proc/driver/nvidia; } >/dev/null 2>&1 && echo yes)
ifeq ($(TORCH_BUILD),auto)
TORCH_CPU := $(if $(NVIDIA_FOUND),,$(if $(filter Linux,$(shell uname -s 2>/dev/null)),auto,))
else ifeq ($(TORCH_BUILD),cpu)
TORCH_CPU := forced
else ifeq ($(TORCH_BUILD),cuda)
TORCH_CPU :=
else
$(error TORCH_BUILD must be auto, cpu or cuda, not '$(TORCH_BUILD)')
endif
HAS_TORCH := $(PY) -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("torch") is None)'
CPU_INDEX_REACHABLE := $(PY) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)' '$(TORCH_CPU_INDEX)' >/dev/null 2>&1

define install_cpu_torch
	@if $(HAS_TORCH); then \
	  echo "torch: $(VENV) already has one, kept (make clean-venv to start over)"; \
	elif [ "$(TORCH_CPU)" = forced ] || $(CPU_INDEX_REACHABLE); then \
	  echo "torch: the CPU build from $(TORCH_CPU_INDEX) (TORCH_BUILD=$(TORCH_BUILD); TORCH_BUILD=cuda for PyPI's CUDA build)"; \
	  $(PY) -m pip install --quiet --index-url '$(TORCH_CPU_INDEX)' 'torch>=2.4'; \
	else \
	  echo "torch: $(TORCH_CPU_INDEX) cannot be reached; PyPI's torch instead (on Linux its CUDA build, about 5 GB)"; \
	fi
endef

$(LAB_STAMP): requirements.txt pyproject.toml | $(PY)
	$(if $(TORCH_CPU),$(install_cpu_torch))
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $@

# pip's own progress (no --quiet): nbgrader and its dependencies take a minute or two.
$(INSTRUCTOR_STAMP): requirements-instructor.txt $(LAB_STAMP)
	@echo "[make instructor] 2/3 nbgrader (requirements-instructor.txt) into $(VENV); pip lists each package"
	$(PY) -m pip install --progress-bar on -r requirements-instructor.txt
	@echo "[make instructor] nbgrader $$($(PY) -c 'from importlib.metadata import version; print(version("nbgrader"))') is installed"
	touch $@

# The test suite includes a whole nbgrader workshop (tests/tools/test_workshop.py), so it needs nbgrader too.
$(TEST_STAMP): requirements-dev.txt $(INSTRUCTOR_STAMP)
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

setup: $(LAB_STAMP)
setup-test: $(TEST_STAMP)

# Jupyter refuses to run as root unless told; containers and some lab machines are root.
ALLOW_ROOT := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

# The server's root is the course folder, so its file browser has exercises/, solutions/ and docs/; the browser
# opens lesson 00 (default_url). A notebook named on the command line would instead make the notebook's folder
# the root (notebooks/ only). LAB_ARGS adds options, e.g. LAB_ARGS=--no-browser or LAB_ARGS=--ServerApp.port=8890;
# tests/course/test_make_lab.py starts exactly `make -s print-lab-command` and asks the server for the folders.
START_NOTEBOOK := notebooks/00_start_here.ipynb
LAB_ARGS ?=
LAB_COMMAND = $(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir='$(CURDIR)' \
              --LabApp.default_url=/lab/tree/$(START_NOTEBOOK) $(ALLOW_ROOT) $(LAB_ARGS)

lab: $(LAB_STAMP)
	$(LAB_COMMAND)

# nbgrader starts helper programs (alembic) by name, so the venv's bin/ goes first on PATH. Each step says what it
# does (PIP_VERBOSE=1 cancels the lab set-up's --quiet, so pip shows its downloads), and JupyterLab then stays
# open in this terminal until Ctrl-C: nbgrader's commands go in a second terminal (docs/instructor_guide.md).
instructor:
	@$(MAKE) --no-print-directory -q $(LAB_STAMP) && echo "[make instructor] 1/3 the course's $(VENV): already set up" || { \
	  echo "[make instructor] 1/3 the course's $(VENV): torch and the lessons' packages (several minutes on a fresh machine)"; \
	  PIP_VERBOSE=1 $(MAKE) --no-print-directory $(LAB_STAMP); }
	@$(MAKE) --no-print-directory -q $(INSTRUCTOR_STAMP) && echo "[make instructor] 2/3 nbgrader: already installed" || \
	  $(MAKE) --no-print-directory $(INSTRUCTOR_STAMP)
	@echo "[make instructor] 3/3 JupyterLab with nbgrader's formgrader (menu Nbgrader > Formgrader), serving $(CURDIR)."
	@echo "[make instructor] It stays open in this terminal; Ctrl-C stops it. In a second terminal: source $(BIN)/activate,"
	@echo "[make instructor] then python -m amp_lessons doctor --instructor (docs/instructor_guide.md, Set up once)."
	PATH="$(CURDIR)/$(BIN):$$PATH" $(LAB_COMMAND)

.PHONY: print-lab-command
print-lab-command:
	@echo "$(LAB_COMMAND)"

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Rewrite every Python file and notebook the way `ruff format` wants it, and apply ruff's safe fixes.
format: $(TEST_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

exercises-check: $(TEST_STAMP)
	$(PY) -m amp_lessons build-exercises --check

# The deployments, each a few minutes of servers and accounts: a class on JupyterHub, the guide's nbgrader workshop
# as written, a two-lesson web edition built and opened. `make integration` runs them (CI does, after `make test`).
INTEGRATION := tests/deploy/test_hub.py tests/tools/test_workshop.py tests/course/test_site.py
unit: $(TEST_STAMP)
	$(TEST_ENV) $(PY) -m pytest -n 2 --durations=12 tests $(addprefix --ignore=,$(INTEGRATION))

integration: $(TEST_STAMP)
	$(TEST_ENV) $(PY) -m pytest -n 2 --durations=6 $(INTEGRATION)

# Line and branch coverage of amp_lessons over the unit and integration tests (not of the kernels the notebook
# tests start; tracing makes the run about a third slower, so `make test` does not measure it); afterwards
# `.venv/bin/python -m coverage report` lists every module, `coverage html` writes htmlcov/.
coverage: $(TEST_STAMP)
	$(TEST_ENV) $(PY) -m pytest -n 2 --cov=amp_lessons --cov-report= tests
	@echo "coverage of amp_lessons (lines and branches): $$($(PY) -m coverage report --format=total)%"

# Lessons and solutions must pass every check; generated exercises must still say "not done yet".
notebooks: $(TEST_STAMP)
	$(TEST_ENV) AMP_LESSONS_STRICT=1 $(PY) -m pytest $(NBVAL) notebooks solutions
	$(TEST_ENV) AMP_LESSONS_STRICT=not-done $(PY) -m pytest $(NBVAL) exercises

# In `make test` the unit run's browser test (tests/course/test_browser.py) has already run every lesson top to
# bottom in JupyterLab, as strictly (AMP_LESSONS_STRICT=1): the lessons run here again only where it could not
# (no Chromium or no Playwright: it skipped). Solutions and exercises always run here.
BROWSER_RUNS_LESSONS = $(shell $(PY) tests/course/test_browser.py 2>/dev/null)
test-notebooks: $(TEST_STAMP)
	$(TEST_ENV) AMP_LESSONS_STRICT=1 $(PY) -m pytest $(NBVAL) $(if $(BROWSER_RUNS_LESSONS),,notebooks) solutions
	$(TEST_ENV) AMP_LESSONS_STRICT=not-done $(PY) -m pytest $(NBVAL) exercises

test: lint exercises-check unit test-notebooks
	@echo "make test: all passed"

# One lesson's inner loop: `make lesson L=05` runs tests/l05_*/ (its helpers and checker) and its three
# notebooks (lesson, solution, untouched exercise). Lesson 00 has no exercise notebook.
lesson: $(TEST_STAMP)
	@test -n "$(L)" || { echo "usage: make lesson L=05   (a lesson number, 00-$(LAST_LESSON))"; exit 2; }
	@test -d "$(wildcard tests/l$(L)_*)" || { echo "no lesson $(L): tests/l$(L)_*/ does not exist"; exit 2; }
	$(TEST_ENV) $(PY) -m pytest -q -n 2 tests/l$(L)_*
	$(TEST_ENV) AMP_LESSONS_STRICT=1 $(PY) -m pytest -q $(NBVAL) $(wildcard notebooks/$(L)_*.ipynb solutions/$(L)_*.ipynb)
	$(if $(wildcard exercises/$(L)_*.ipynb),$(TEST_ENV) AMP_LESSONS_STRICT=not-done $(PY) -m pytest -q $(NBVAL) $(wildcard exercises/$(L)_*.ipynb))

# The promised minimums (README: Python 3.9+, torch 2.4+): a second venv, $(VENV_MIN), with requirements-min.txt
# (torch 2.4.1 and the oldest numpy/pandas/matplotlib requirements.txt allows), then the unit tests (not the
# browser test, which `make test` runs) and every notebook on it. PYTHON_MIN is its interpreter (CI: 3.9).
# The first run downloads about 3.5 GB (PyPI's torch 2.4.1 for Linux is a CUDA build with its nvidia libraries).
PYTHON_MIN ?= $(PYTHON)
VENV_MIN   ?= .venv-min
PY_MIN     := $(VENV_MIN)/bin/python
MIN_STAMP  := $(VENV_MIN)/.stamp-min

$(PY_MIN):
	$(PYTHON_MIN) -m venv $(VENV_MIN)
	$(PY_MIN) -m pip install --quiet --upgrade pip

$(MIN_STAMP): requirements-min.txt requirements.txt pyproject.toml | $(PY_MIN)
	$(PY_MIN) -m pip install --quiet -r requirements-min.txt
	$(PY_MIN) -m pip install --quiet --no-deps -e .
	touch $@

.PHONY: test-min
test-min: $(MIN_STAMP)
	$(TEST_ENV) $(PY_MIN) -m pytest -n 2 tests --ignore=tests/course/test_browser.py $(addprefix --ignore=,$(INTEGRATION))
	$(TEST_ENV) AMP_LESSONS_STRICT=1 $(PY_MIN) -m pytest $(NBVAL) notebooks solutions
	$(TEST_ENV) AMP_LESSONS_STRICT=not-done $(PY_MIN) -m pytest $(NBVAL) exercises
	@$(PY_MIN) -c 'import sys, torch; print("make test-min: all passed on Python", sys.version.split()[0], "with torch", torch.__version__)'

# On a CUDA machine: the suite and every lesson with AMP_LESSONS_REQUIRE_CUDA=1, GPU figures kept in
# docs/gpu_report.json and the instructor guide's GPU table regenerated. Refuses (exit 2) without CUDA.
gpu-report: $(TEST_STAMP)
	$(TEST_ENV) $(PY) -m amp_lessons gpu-report

clean-venv:
	rm -rf $(VENV)

# A class on JupyterHub (deploy/jupyterhub/README.md; the instructor guide's "Run the workshop on a hub").
# `make hub` starts the hub on http://127.0.0.1:8000 for a dry run: as root, one UNIX account per learner; otherwise
# every server runs as you. The hub's packages go into $(HUB_VENV), which sees the course's $(VENV) through a .pth file
# (torch is not installed twice, and $(VENV) stays what laptops have); the proxy, npm's configurable-http-proxy, into
# .hub-node/. Learners' servers run $(HUB_VENV)'s Python as the learner's account, so HUB_PYTHON (its interpreter)
# must be one every account can run, of $(VENV)'s Python version: /usr/bin/python3, not one under /root or a home.
# $(HUB_VENV)/bin also gets $(VENV)'s commands (nbgrader, alembic, jupyter), pointed at its own Python.
# HUB_PASSWORD is the room's password, HUB_ADMIN_PASSWORD the instructors' (32+ characters); the dry-run defaults
# below are refused unless the hub listens on 127.0.0.1 only.
HUB_VENV   ?= .venv-hub
HUB_PYTHON ?= $(PYTHON)
HUB_PY     := $(HUB_VENV)/bin/python
HUB_STAMP  := $(HUB_VENV)/.stamp-hub
HUB_PROXY  := .hub-node/node_modules/.bin/configurable-http-proxy
HUB_PASSWORD       ?= dry-run-password
HUB_ADMIN_PASSWORD ?= dry-run-instructor-password-0123456789
PY_VERSION := import sys; print(*sys.version_info[:2])
SITE_PACKAGES := import sysconfig; print(sysconfig.get_paths()["purelib"])

.PHONY: hub hub-setup
$(HUB_STAMP): requirements-hub.txt $(INSTRUCTOR_STAMP)
	@test "$$($(HUB_PYTHON) -c '$(PY_VERSION)')" = "$$($(PY) -c '$(PY_VERSION)')" || \
	  { echo "HUB_PYTHON=$(HUB_PYTHON) is not $(VENV)'s Python version"; exit 2; }
	@test "$$($(HUB_PYTHON) -V)" = "$$($(PY) -V)" || echo "make hub-setup: warning: HUB_PYTHON is $$($(HUB_PYTHON) -V)," \
	  "$(VENV) has $$($(PY) -V); $(VENV)'s packages mostly work across patch releases, not all (README.md)"
	test -x $(HUB_PY) || $(HUB_PYTHON) -m venv $(HUB_VENV)
	$(PY) -c 'import sysconfig; print("import site; site.addsitedir(%r)" % sysconfig.get_paths()["purelib"])' \
	  > "$$($(HUB_PY) -c '$(SITE_PACKAGES)')/amp_course_venv.pth"
	$(HUB_PY) -m pip install --quiet -r requirements-hub.txt
	@for script in $(VENV)/bin/*; do name=$${script##*/}; \
	  if [ ! -e $(HUB_VENV)/bin/$$name ] && head -n 1 $$script | grep -qx '#!$(abspath $(PY))'; then \
	    sed '1s|.*|#!$(abspath $(HUB_PY))|' $$script > $(HUB_VENV)/bin/$$name && chmod 755 $(HUB_VENV)/bin/$$name; \
	  fi; done
	touch $@

$(HUB_PROXY):
	@command -v npm >/dev/null || { echo "configurable-http-proxy needs npm (Node.js 18+): sudo apt-get install npm"; exit 2; }
	npm install --prefix .hub-node --no-audit --no-fund --loglevel=error configurable-http-proxy@5

hub-setup: $(HUB_STAMP) $(HUB_PROXY)

hub: hub-setup
	@echo "make hub: the room's password is '$(HUB_PASSWORD)'; instructors ($${AMP_HUB_INSTRUCTORS:-instructor}) use '$(HUB_ADMIN_PASSWORD)'"
	AMP_HUB_PASSWORD='$(HUB_PASSWORD)' AMP_HUB_ADMIN_PASSWORD='$(HUB_ADMIN_PASSWORD)' \
	  $(HUB_VENV)/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

# The web edition (site/, site/README.md): every lesson run on this machine (outputs cached in site/_build/cache,
# so an unchanged notebook with an unchanged package is not run again), the exercises, the cheatsheet, the guide and
# the architecture page, as static HTML in $(SITE_OUT) (open $(SITE_OUT)/index.html, or serve the folder).
# Sphinx + myst-nb + sphinx-book-theme go into .venv-site (requirements-site.txt), which sees .venv through a .pth
# file: torch and the course are not installed twice, and .venv stays what laptops have.
# `make site-check` opens every page of the built site in headless Chromium (tests/course/test_site.py).
VENV_SITE  ?= .venv-site
PY_SITE    := $(VENV_SITE)/bin/python
SITE_STAMP := $(VENV_SITE)/.stamp-site
SITE_OUT   ?= site/_build/html
SITE_PURELIB = import sysconfig; print(sysconfig.get_paths()["purelib"])

$(SITE_STAMP): requirements-site.txt $(LAB_STAMP)
	test -x $(PY_SITE) || $(PYTHON) -m venv $(VENV_SITE)
	$(PY_SITE) -m pip install --quiet --upgrade pip
	$(PY_SITE) -m pip install --quiet -r requirements-site.txt
	echo "import site; site.addsitedir('$$($(PY) -c '$(SITE_PURELIB)')')" > "$$($(PY_SITE) -c '$(SITE_PURELIB)')/amp_course_venv.pth"
	touch $@

.PHONY: site site-setup site-check
site-setup: $(SITE_STAMP)

# The integration tests build a two-lesson site (tests/course/test_site.py): its venv is part of their set-up.
integration coverage: $(SITE_STAMP)


site: $(SITE_STAMP)
	$(PY_SITE) -m sphinx -b html -W --keep-going -c site . $(SITE_OUT)
	@echo "make site: $(SITE_OUT)/index.html (serve it: $(PY_SITE) -m http.server -b 127.0.0.1 -d $(SITE_OUT))"

site-check: site $(TEST_STAMP)
	AMP_SITE_HTML=$(SITE_OUT) $(TEST_ENV) $(PY) -m pytest -q tests/course/test_site.py
