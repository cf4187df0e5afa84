# Root conftest: the plugin itself is loaded through its pytest11 entry point (pyproject.toml).
# Keep this file free of fixtures so `pytest experiments` and `pytest tests` behave the same as
# they do for a user who installed the plugin into another project.
