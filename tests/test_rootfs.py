"""engines/rootfs.py: what an image's root does without, removed without reaching outside it."""
from __future__ import annotations

from pytest_agentcgroup.engines.rootfs import IMAGE_PRUNE, prune_for_image


def test_prune_for_image_empties_its_directories_and_follows_no_symlink(tmp_path):
    root, canary = tmp_path / "root", tmp_path / "outside"
    canary.mkdir()
    (canary / "keep").write_text("host file")
    for rel in IMAGE_PRUNE:
        (root / rel / "sub").mkdir(parents=True)
        (root / rel / "sub" / "f").write_text("x")
        (root / rel / "link").symlink_to(canary)
    (root / "usr/share/doc/dirlink").symlink_to(canary, target_is_directory=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").write_text("kept")
    prune_for_image(root)
    assert all((root / rel).is_dir() and not any((root / rel).iterdir()) for rel in IMAGE_PRUNE)
    assert (canary / "keep").read_text() == "host file" and (root / "usr/bin/python3").exists()


def test_prune_for_image_leaves_a_directory_reached_through_a_link_on_the_way(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "doc" / "pkg").mkdir(parents=True)
    (outside / "doc" / "pkg" / "copyright").write_text("host file")
    (root / "usr").mkdir(parents=True)
    (root / "usr" / "share").symlink_to(outside, target_is_directory=True)
    prune_for_image(root)
    assert (outside / "doc" / "pkg" / "copyright").read_text() == "host file"
