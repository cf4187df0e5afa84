"""Tests on real kernels with pure cgroup v2, in a VM (a package: its conftest must not shadow tests/conftest.py)."""
