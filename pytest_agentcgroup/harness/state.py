"""The session's state and the stash keys the harness modules share.

May import: config, traces/, cgroups/, metrics/ and the harness's settings and controller.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from .. import config as cfgmod
from ..cgroups import RunTree
from ..cgroups.isolate import WorkerIsolation
from ..metrics.store import ResultsStore
from ..traces.corpus import Corpus
from ..traces.ir import TraceError
from .controller import MetricsController
from .settings import setting


@dataclass
class State:
    """What one pytest process holds for its session (in `config.stash[STATE]`): the loaded config
    and corpus, and what the session fixtures made, so that fixtures.close_session can undo it."""
    experiments: cfgmod.Config | None = None
    corpus: Corpus | None = None
    tree: RunTree | None = None
    run_tree: dict | None = None    # the tree's {"controllers", "refused"}, kept after it is closed
    isolation: WorkerIsolation | None = None
    store: ResultsStore | None = None   # serially the run's; an xdist worker's: session.WorkerStore
    host_sent: bool = False             # an xdist worker: its machine went with its first records
    run_tree_sent: dict | None = None   # an xdist worker: the run tree as its reports last carried it
    summaries: list = field(default_factory=list)
    faithful: list = field(default_factory=list)     # per trace: how faithful its real commands' replay was
    failures: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)      # Arm -> its session's controller (policy arms only)
    policy_errors: dict = field(default_factory=dict)  # Arm -> why its eBPF program failed to build

    # pytest.fail outside each `except`: the message once, not again after "During handling of the
    # above exception, another exception occurred"
    def load_config(self, config: pytest.Config) -> cfgmod.Config:
        if self.experiments is None:
            try:
                self.experiments = cfgmod.load(setting(config, "config"))
            except cfgmod.ConfigError as exc:
                error = str(exc)
            else:
                return self.experiments
            pytest.fail(error, pytrace=False)
        return self.experiments

    def load_corpus(self, config: pytest.Config) -> Corpus:
        if self.corpus is None:
            root = setting(config, "traces") or str(self.load_config(config).traces)
            try:
                self.corpus = Corpus.open(root)
            except TraceError as exc:
                error = str(exc)
            else:
                return self.corpus
            pytest.fail(f"trace corpus: {error}", pytrace=False)
        return self.corpus


STATE = pytest.StashKey[State]()
CONTROLLER = pytest.StashKey[MetricsController]()
REPLAY_SECONDS = pytest.StashKey[float]()
