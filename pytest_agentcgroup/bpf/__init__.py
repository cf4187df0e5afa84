"""eBPF: one loader per program (the C sources: the top-level bpf/, one per program, found by
loader.programs_dir()), the host's BPF features, and the policy controller that acts on the
programs' events.

May import: cgroups/ (host layout, nodes, arms) and traces/. Never metrics/ or anything above.
"""
