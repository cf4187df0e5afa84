# pytest-agentcgroup — `make test`, `make run`; extra pytest args: PYTEST_ARGS="-k foo -x"
PY           := .venv/bin/python
# the command line (pyproject.toml's console script, installed by `make setup`)
AGENTCGROUP  := .venv/bin/agentcgroup
PYTEST_ARGS  ?=
# package groups for hostsetup.sh; empty means $$AGENTCGROUP_GROUPS or "core docker browser"
SETUP_GROUPS ?=
# `make run` fails on a regression against this baseline; `make baseline` rewrites it
BASELINE     ?= experiments/baseline/smoke.json

.PHONY: setup setup-vm setup-kernels test test-quick test-kernels run real baseline report paper docs clean clean-images clean-emulator recorded-here

setup:
	@bash pytest_agentcgroup/hostsetup.sh $(SETUP_GROUPS)

# qemu and the Debian kernels tests/kernels/ boots with pure cgroup v2: 6.12 (group vm) for
# `make test`, 6.1, 6.12 and 7.3 (group vm-kernels) for `make test-kernels`
setup-vm: setup
	@bash pytest_agentcgroup/hostsetup.sh vm

setup-kernels: setup
	@bash pytest_agentcgroup/hostsetup.sh vm-kernels

# pytest exit 5 means "no tests collected": treat it as a failure, not a pass.
# tests/kernels/ runs its subset on kernel 6.12 here (--agentcgroup-kernels default); the slowest
# host tests are listed at the end (the guest's own list is in its subset.log).
test: setup-vm
	@$(PY) -m pytest tests -q --durations=15 $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; exit $$rc

# the edit-test loop: the host tests without a VM, docker, the slow ones or the package registries,
# on two xdist workers (1 min 55 s here; 3 min 32 s serially, PYTEST_ARGS="-n 0"). Markers are in
# pyproject.toml; any other subset: PYTEST_ARGS='-m "..."' (the last -m wins).
QUICK        := not vm and not docker and not slow and not network
test-quick: setup
	@$(PY) -m pytest tests -q -n 2 -m "$(QUICK)" $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; exit $$rc

# the pure cgroup v2 subset on every kernel series, one verdict line per kernel at the end
test-kernels: setup-kernels
	@$(PY) -m pytest tests/kernels -q --agentcgroup-kernels=all $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; exit $$rc

run: setup
	@$(PY) -m pytest experiments -q --benchmark-columns=median --agentcgroup-out results --agentcgroup-baseline $(BASELINE) $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; exit $$rc

# the `real` subset (traces/mini-swe-agent, traces/openhands-rows): public agent trajectories' real
# commands in their workspaces, under the sandbox and then the docker executor (exp1's unlimited arm:
# the real commands, no limit to kill them). The first run builds the workspaces pinned in
# traces/workspaces.lock.json from PyPI (and a Debian root for Python 3.9) into the cache; later
# runs use the cache, without network.
# A trace whose compared steps diverge beyond max_divergence fails; the summary says per trace how
# faithful its replay was. Every exp1 arm: PYTEST_ARGS='-k exp1' (docs/workspaces.md).
REAL_ARGS    := experiments/test_exp1_domain_mismatch.py -q -k unlimited --agentcgroup-subset real
real: setup
	@for ex in sandbox docker; do \
	  $(PY) -m pytest $(REAL_ARGS) --agentcgroup-executor $$ex --agentcgroup-out results-real $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; [ $$rc -eq 0 ] || exit $$rc; done

baseline: setup
	@$(PY) -m pytest experiments -q --benchmark-columns=median --agentcgroup-out results --agentcgroup-save-baseline $(BASELINE) $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; exit $$rc

# the HTML report of the newest run in results/ (make run; `results` means its newest run):
# report/index.html, runs.csv, figures
report: setup
	@$(AGENTCGROUP) report results -o report --config experiments/agentcgroup.toml

# Experiment 1 as a frontier: every arm at static limits swept over the trace-peak percentiles of the
# recorded corpus's paper subset (experiments/exp1-paper.toml, 22 min with PYTEST_ARGS="-n 2"; the
# 1 Hz-derived corpus's: PAPER_CONFIG=experiments/exp1-paper-derived.toml, 1 h 20 min; see
# docs/experiments/exp1.md), then its report with the kills-vs-reserved-memory figure in
# report-paper/index.html. No baseline gate: a measurement.
PAPER_CONFIG ?= experiments/exp1-paper.toml
paper: setup
	@$(PY) -m pytest experiments/test_exp1_domain_mismatch.py -q --benchmark-columns=median \
	  --agentcgroup-config $(PAPER_CONFIG) --agentcgroup-out results-paper $(PYTEST_ARGS); rc=$$?; \
	  [ $$rc -eq 5 ] && echo "no tests were collected" && exit 1; \
	  $(AGENTCGROUP) report results-paper -o report-paper --config $(PAPER_CONFIG) || exit 1; exit $$rc

# The documentation (docs/: Sphinx, pages in MyST Markdown) into docs/_build/html, warnings as
# errors: -n and MyST check every cross-reference and heading anchor, autodoc imports the API modules
# (bcc mocked: no root needed). First the results pages of the runs docs/results/published.toml
# lists (committed run directories, so that a fresh clone builds them) into docs/results/pages/. No linkcheck: this machine reaches no web site but the package
# registries, and internal links are already checked here. The `docs` extra is installed once, again
# when pyproject.toml changes (a stamp, as hostsetup.sh keeps for the `test` extra).
DOCS_STAMP   := .venv/.docs-pip-stamp
docs: setup $(DOCS_STAMP)
	@$(AGENTCGROUP) report --publish docs/results/published.toml >/dev/null
	@$(PY) -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

$(DOCS_STAMP): pyproject.toml | setup
	@echo "docs: pip install -e '.[docs]' into .venv"
	@log=$$(mktemp); $(PY) -m pip install -q --disable-pip-version-check -e '.[docs]' >$$log 2>&1 || \
	  { tail -n 20 $$log; echo "docs: pip install failed (log $$log)"; exit 1; }; rm -f $$log
	@touch $@

clean:
	rm -rf .venv results report results-paper report-paper docs/_build docs/results/pages

# The recorded-here corpus (issue 15): its workspace (more-itertools' sdist and a wheel directory,
# pinned by sha256, from PyPI) and its command traces (written from tools/recorded_here.py; not in
# traces/, where each trace is once: the profiled one) profiled on this machine into traces/ (subset
# recorded-here; resumable: a trace already complete there is kept, delete it to profile it again)
recorded-here: setup
	@$(AGENTCGROUP) tools recorded-here workspace .cache/recorded-here/workspace
	@rm -rf .cache/recorded-here/commands
	@$(AGENTCGROUP) tools recorded-here traces .cache/recorded-here/commands
	@$(AGENTCGROUP) traces profile .cache/recorded-here/commands -o traces \
	  --workspace .cache/recorded-here/workspace --subset recorded-here

# the Docker images the project built (agentcgroup/...), so that the next run builds them from nothing;
# starts dockerd for it when none answers (and stops it again); silent when there is nothing to remove
clean-images: setup
	@$(AGENTCGROUP) images clean

# the emulator binaries compiled on first use (replay/emulator_build.py), so the next run compiles it
clean-emulator: setup
	@$(AGENTCGROUP) emulator clean
