"""`agentcgroup images`, `emulator`, `bpf` and `doctor`: the command lines about this machine's set-up
(the Docker images and the emulator binaries it built, the BPF features its kernel offers, the
programs set-up installs)."""
from __future__ import annotations

import sys

from . import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, command_group


def add_parsers(sub) -> None:
    _add_images(sub)
    _add_emulator(sub)
    _add_bpf(sub)
    _add_doctor(sub)


def _add_images(sub) -> None:
    isub = command_group(sub, "images", help="the Docker images this project builds",
                         description="The Docker images this project builds (named agentcgroup/...).")
    c = isub.add_parser(
        "clean", help="remove the project's Docker images, so that the next run builds them again",
        description="Remove the Docker images this project built (every agentcgroup/... tag, and the "
                    "local image), so that the next run builds them from nothing. dockerd is started "
                    "for it when no engine answers, and stopped again after. Prints each image "
                    "removed; silent when there is none. Exit 1 when the engine cannot be reached or "
                    "started, or an image is still used by a container.")
    c.add_argument("--image", action="append", metavar="NAME",
                   help="remove only this image (repeatable), e.g. a throw-away tag")
    c.set_defaults(func=cmd_images_clean)


def _add_emulator(sub) -> None:
    esub = command_group(sub, "emulator", help="the resource emulator's binaries, compiled on first use",
                         description="The resource emulator's binaries, compiled on first use into a "
                                     "cache keyed by the source's hash.")
    c = esub.add_parser(
        "clean", help="remove the emulator binaries this user built, so that the next run compiles it again",
        description="Remove the emulator binaries this user built in its cache directories (only files it "
                    "owns), so that the next run compiles the emulator from its source as a fresh machine "
                    "would. Prints each file removed; silent when there is none.")
    c.set_defaults(func=cmd_emulator_clean)


def _add_bpf(sub) -> None:
    bsub = command_group(sub, "bpf", help="the kernel's BPF features the policy arms need",
                         description="The kernel's BPF features the policy arms need.")
    f = bsub.add_parser(
        "features", help="which BPF features this host offers, one line each with the reason",
        description="Probe which BPF features this host offers (each probe loads nothing that outlives it) "
                    "and print one line per feature: yes or no, its name, and why. Arms and tests that "
                    "need an absent feature skip with that reason. Exit 0 whatever the answer.")
    f.set_defaults(func=cmd_bpf_features)


def _add_doctor(sub) -> None:
    from .. import programs
    d = sub.add_parser(
        "doctor", help="check that the programs of the set-up groups are installed",
        description=f"Check that every program of the given hostsetup.sh groups (and of base and setup) is on "
                    f"PATH: one line per missing program naming its Debian package; exit 1 when any is "
                    f"missing. Groups: {', '.join(programs.known_groups())}; default: "
                    f"{' '.join(programs.DEFAULT_GROUPS)}. The table: pytest_agentcgroup/programs.tsv.")
    d.add_argument("groups", nargs="*", metavar="GROUP", help="comma- or space-separated groups")
    d.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
    from .. import programs
    groups = [g for arg in args.groups for g in arg.split(",") if g] or list(programs.DEFAULT_GROUPS)
    try:
        return EXIT_BAD_INPUT if programs.check(groups) else EXIT_OK
    except ValueError as exc:
        print(f"agentcgroup doctor: {exc}", file=sys.stderr)
        return EXIT_USAGE


def cmd_images_clean(args) -> int:
    from ..engines.docker import remove_project_images
    from ..errors import ExecutorUnavailable
    try:
        removed = remove_project_images(args.image)
    except ExecutorUnavailable as exc:
        print(f"agentcgroup images clean: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for name in removed:
        print(f"removed image {name}")
    return EXIT_OK


def cmd_emulator_clean(args) -> int:
    from ..replay.emulator_build import remove_built
    for path in remove_built():
        print(f"removed {path}")
    return EXIT_OK


def cmd_bpf_features(args) -> int:
    from ..bpf.features import report
    print(report())
    return EXIT_OK
