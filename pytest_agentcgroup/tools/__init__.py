"""Corpus-building tools, run by hand to regenerate what traces/ ships; never imported at run time.

    agentcgroup tools build-corpus SRC_DIR OUT_DIR            (the claude-code corpus)
    agentcgroup tools browser-record DATASETS OUT_DIR         (the playwright traces)
    agentcgroup tools recorded-here workspace|traces DIR      (the recorded-here corpus)

May import anything below the pytest side (traces/, replay/, tenants/); nothing in the package
imports tools/ but the command line (cli/tools.py).
"""
