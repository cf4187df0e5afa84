"""The one build step pyproject.toml cannot say: the eBPF C sources live in the checkout's top-level
bpf/ (one program per file, with common.h) and ship inside the package, as
pytest_agentcgroup/bpf/programs/, in the wheel and the sdist (tests/test_wheel.py checks it).

build_py lists them as one more data-file group of its own (source dir bpf/, target
pytest_agentcgroup/bpf/programs/ in the build), so building copies them, the sdist carries them, and
the wheel's record lists them. An editable install imports the package from the checkout, where
pytest_agentcgroup.bpf.loader.programs_dir() finds bpf/ itself; nothing is copied there.
Everything else about the project is in pyproject.toml.
"""
from __future__ import annotations

import os
from glob import glob

from setuptools import setup
from setuptools.command.build_py import build_py

BPF_SOURCES = "bpf"                                   # in the checkout
BPF_PACKAGED = ("pytest_agentcgroup", "bpf", "programs")  # in the wheel; loader.programs_dir() knows both
BPF_PATTERNS = ("*.bpf.c", "*.h")


class build_py_with_bpf(build_py):
    def _bpf_group(self) -> tuple[str, str, str, list[str]]:
        """(package, src_dir, build_dir, filenames), the shape of build_py's data_files entries."""
        names = sorted({os.path.basename(p) for pattern in BPF_PATTERNS
                        for p in glob(os.path.join(BPF_SOURCES, pattern))})
        if not names:
            raise FileNotFoundError(f"no eBPF sources ({', '.join(BPF_PATTERNS)}) in {os.path.abspath(BPF_SOURCES)}")
        return ".".join(BPF_PACKAGED), BPF_SOURCES, os.path.join(self.build_lib, *BPF_PACKAGED), names

    # building (build_package_data, get_outputs, the editable link tree) reads data_files, which
    # setuptools computes with _get_data_files; the sdist asks get_data_files_without_manifest
    def _get_data_files(self):
        return [*super()._get_data_files(), self._bpf_group()]

    def get_data_files_without_manifest(self):
        return [*super().get_data_files_without_manifest(), self._bpf_group()]


setup(cmdclass={"build_py": build_py_with_bpf})
