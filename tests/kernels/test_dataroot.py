"""The guest's Docker data root, made on the host (dataroot.py), checked the way the guest uses it:
unpacked into an empty directory, it gives a dockerd that never saw the image that image, layers
and all, and nothing of the private engine is left behind."""
from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from . import dataroot


def test_the_data_root_made_on_the_host_serves_the_image_to_a_dockerd_that_never_loaded_it(tmp_path, agentcgroup_docker):
    name = agentcgroup_docker.ensure_image()
    tar = dataroot.write_data_root(agentcgroup_docker, name, tmp_path / "docker-root.tar")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docker-root.tar", "docker-root.tar.dockerd.log"], \
        "only the tarball and the log come out; the private engine's data root is gone"
    with tarfile.open(tar) as t:
        assert {m.name.split("/")[0] for m in t.getmembers()} == set(dataroot.KEPT)
    unpacked = tmp_path / "var-lib-docker"           # as the guest does, into an empty directory
    unpacked.mkdir(mode=0o700)
    subprocess.run(["tar", "-C", str(unpacked), "--xattrs", "--xattrs-include=*", "-xf", str(tar)], check=True,
                   timeout=300)
    with dataroot.private_dockerd(unpacked, log=tmp_path / "reader.log") as client:
        image = client.images.get(name)
        upper = Path(image.attrs["GraphDriver"]["Data"]["UpperDir"])
        assert upper.is_relative_to(unpacked) and (upper / "usr" / "bin" / "python3").exists(), upper
