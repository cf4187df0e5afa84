"""Corpus-building tools, run by hand to regenerate what traces/ ships; never imported at run time.

    python -m pytest_agentcgroup.tools.build_corpus SRC_DIR OUT_DIR        (the claude-code corpus)
    python -m pytest_agentcgroup.tools.browser_record DATASETS OUT_DIR     (the playwright traces)

May import anything below the pytest side (traces/, replay/, tenants/); nothing in the package
imports tools/.
"""
