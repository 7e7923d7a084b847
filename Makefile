# Two commands do the whole setup on a fresh machine (Python 3.11 and make only):
#   make lab    create .venv, install, publish the student edition if missing, open JupyterLab
#   make test   create .venv if needed, then run every test (pytest, notebooks, autograder verify)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NO_LSP_SEARCH := $(VENV)/etc/jupyter/jupyter_server_config.json
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json

# Keep Jupyter, IPython and matplotlib from writing to the user's home directory.
export JUPYTER_CONFIG_DIR := $(CURDIR)/$(VENV)/home/jupyter-config
export JUPYTER_DATA_DIR := $(CURDIR)/$(VENV)/home/jupyter-data
export JUPYTER_RUNTIME_DIR := $(CURDIR)/$(VENV)/home/jupyter-runtime
export IPYTHONDIR := $(CURDIR)/$(VENV)/home/ipython
export MPLCONFIGDIR := $(CURDIR)/$(VENV)/home/matplotlib
export JUPYTER_PLATFORM_DIRS := 1
VENV_HOME := $(JUPYTER_CONFIG_DIR) $(JUPYTER_DATA_DIR) $(JUPYTER_RUNTIME_DIR) $(IPYTHONDIR) $(MPLCONFIGDIR)
# The venv's bin/ on PATH: nbgrader shells out to alembic (autograder/README.md, nbgrader fact 2).
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: setup sandbox browser lab lab-tools test quick regress release bench gpu-check clean

setup: $(STAMP) $(NO_LSP_SEARCH) $(LAB_OVERRIDES) | $(VENV_HOME)

# The folders exported above, made at setup: IPython warns ("IPython parent '.../.venv/home' is not a writable
# location") in every process and kernel that starts before anything has created .venv/home.
$(VENV_HOME): | $(STAMP)
	mkdir -p $@

# JupyterLab 4 asks every new user "Would you like to get notified about official Jupyter news?" in a toast over
# the notebook's lower right corner, and checks for updates. Both off, in the venv's application settings
# (JupyterLab's documented overrides.json, merged into whatever is there).
$(LAB_OVERRIDES): $(STAMP)
	$(PY) -c "import json, pathlib; p = pathlib.Path('$@'); s = json.loads(p.read_text()) if p.exists() else {}; \
	s.setdefault('@jupyterlab/apputils-extension:notification', {}).update(fetchNews='false', checkForUpdates=False); \
	p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(s, indent=2) + chr(10))"

# jupyter-lsp (part of JupyterLab) searches for language servers when JupyterLab starts: where node is installed
# it runs `npm prefix -g`, and npm writes a log to ~/.npm/_logs/.  The course installs no language server, so the
# search is turned off in the venv's own Jupyter config (merged into what is there).  A rule of its own, not a
# line in $(STAMP)'s, so that a venv set up before it gets it too, without reinstalling.
$(NO_LSP_SEARCH): $(STAMP)
	$(PY) -c "from jupyter_server.config_manager import BaseJSONConfigManager as C; \
	C(config_dir='$(@D)').update('jupyter_server_config', {'LanguageServerManager': {'autodetect': False}})"

# uv installs the pinned set: 35-50 s here where pip took 87 s, most of it compiling bytecode, which the grading
# sandbox needs done in advance (it mounts the venv read-only, so a kernel could not cache what it compiles). uv
# reads no pip configuration: pip's find-links (a local wheel folder, such as the CPU torch wheel on this machine)
# are handed on, so both resolve the same files.
UV_ENV = env $$($(PY) -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$$/\1/p" | head -n 1 | tr ' ' ',' | sed 's/^/UV_FIND_LINKS=/')
NBGRADER_EXCHANGE_SERVER := nbgrader.server_extensions.assignment_list nbgrader.server_extensions.course_list
NBGRADER_EXCHANGE_LAB := @jupyter/nbgrader:assignment-list @jupyter/nbgrader:course-list

$(STAMP): pyproject.toml constraints.txt
	@echo "== setting up $(VENV) (pinned set from constraints.txt) =="
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	$(UV_ENV) $(VENV)/bin/uv pip install --python $(PY) -q --compile-bytecode -c constraints.txt -e '.[lab,grading,test,hf,serve]'
	@# Without JupyterHub, nbgrader's exchange-based extensions only show errors (autograder/README.md, nbgrader fact 8).
	@# What `jupyter server extension disable --sys-prefix` and `jupyter labextension disable --level=sys_prefix`
	@# write, written directly (the two commands took 8 s); both plugins locked as well as disabled, where the command
	@# locked only the first (JupyterLab's migration of a page_config without lockedExtensions copies what is disabled).
	$(PY) -c "from jupyter_server.config_manager import BaseJSONConfigManager as C; \
	[C(config_dir='$(VENV)/etc/jupyter/jupyter_server_config.d').set(n, {'ServerApp': {'jpserver_extensions': {n: False}}}) \
	 for n in '$(NBGRADER_EXCHANGE_SERVER)'.split()]; \
	off = dict.fromkeys('$(NBGRADER_EXCHANGE_LAB)'.split(), True); \
	C(config_dir='$(VENV)/etc/jupyter/labconfig').update('page_config', {'disabledExtensions': off, 'lockedExtensions': off})"
	touch $(STAMP)

# The student edition (autograder publish) has no autograder/edition/release.py: its labs/ are the released notebooks already.
lab: setup
	@if [ -f autograder/edition/release.py ] && $(PY) -c "import autograder.cli" 2>/dev/null; then $(PY) -m autograder release --if-missing; fi
	@$(MAKE) --no-print-directory lab-tools
	$(VENV)/bin/jupyter lab --notebook-dir=$(CURDIR) $$( [ "$$(id -u)" = 0 ] && echo --allow-root )

# nbgrader's instructor tools in JupyterLab (the Nbgrader menu, the "Create Assignment" panel, the formgrader) are
# for this instructor edition; a student's JupyterLab goes without them, locked so that its plugin manager cannot
# turn them back on. What `jupyter labextension disable` / `lock` and `jupyter server extension disable` write, written
# directly (those commands take half a minute on two busy cores), into the venv's config folder: every checkout has
# its own venv. tests/notebooks/test_browser.py runs this rule with EDITION=... and a LAB_CONFIG_DIR of its own.
EDITION ?= $(if $(wildcard autograder/edition/release.py),instructor,student)
LAB_CONFIG_DIR ?= $(VENV)/etc/jupyter
INSTRUCTOR_LAB_PLUGINS := @jupyter/nbgrader:menu @jupyter/nbgrader:create-assignment @jupyter/nbgrader:formgrader
lab-tools:
	@$(PY) -c "from jupyter_server.config_manager import BaseJSONConfigManager as C; \
	off = '$(EDITION)' == 'student'; tools = dict.fromkeys('$(INSTRUCTOR_LAB_PLUGINS)'.split(), off); \
	C(config_dir='$(LAB_CONFIG_DIR)/labconfig', read_directory=False).update('page_config', \
	  {'disabledExtensions': tools, 'lockedExtensions': tools}); \
	C(config_dir='$(LAB_CONFIG_DIR)', read_directory=False).update('jupyter_server_config', \
	  {'ServerApp': {'jpserver_extensions': {'nbgrader.server_extensions.formgrader': not off}}}); \
	print('JupyterLab, $(EDITION) edition: nbgrader\'s instructor tools', 'off' if off else 'on')"

# `grade` runs every submission's kernel in a bubblewrap sandbox (autograder/sandbox/bubblewrap.py) and refuses to
# grade without one; as root on Debian/Ubuntu this installs it where it is missing.
sandbox:
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "== installing bubblewrap (the grading sandbox) =="; \
	  apt-get install -y -qq bubblewrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; }; \
	else echo "note: bubblewrap (bwrap) is missing; grading needs it: install the bubblewrap package as root"; fi; }

# tests/notebooks/test_browser.py drives JupyterLab in headless Chromium (Playwright, from the test extra, uses Debian's
# chromium: Playwright's own browser download is not needed); as root on Debian/Ubuntu this installs it where missing.
# The student edition (autograder publish) has no browser test, so nothing is installed there.
browser:
	@[ ! -f tests/notebooks/test_browser.py ] || command -v chromium >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "== installing chromium (the browser test) =="; \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; \
	else echo "note: chromium is missing; tests/notebooks/test_browser.py skips without it: install the chromium package as root"; fi; }

# Two pytest workers, a test file each at a time: most of the suite waits on kernels and notebooks, so the two
# cores are half idle with one (10.1 min against 7.5 min, measured on this 2-core machine). Files go out in
# collection order, the longest first (tests/conftest.py, LONGEST_FIRST), not pytest-xdist's by number of tests.
test: setup sandbox browser
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder

# The edit loop: the unit tests and the exactness suite, without the tests marked slow (grading kernels, notebooks,
# the browser). `make test` stays the one command that runs everything; CI runs it.
quick: setup
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" -q

regress: setup
	$(PY) -m autograder regress

release: setup
	$(PY) -m autograder release

bench: setup
	$(PY) -m miniengine bench decode
	$(PY) -m miniengine bench batch

# Golden cases on CUDA, bench batch on CUDA, every notebook with DEVICE="cuda"; one summary. Needs a GPU.
# It uses .venv when there is one, else the machine's own python (a GPU box with its CUDA torch).
gpu-check:
	PYTHONPATH=$(CURDIR) $$( [ -x $(PY) ] && echo $(PY) || echo $(PYTHON) ) -m miniengine.course.gpu_check

clean:
	rm -rf $(VENV) course student build
