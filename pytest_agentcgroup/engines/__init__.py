"""Engines the executors run in: the Docker engine (docker.py: a running dockerd or one we start,
the project's local image, built from the host's Debian mirror found by apt_sources.py).

May import: proc, errors. Never replay/, tenants/, cgroups/ or anything above them: the docker
executor (replay/executors/docker.py) imports the engine, not the other way round.
"""
