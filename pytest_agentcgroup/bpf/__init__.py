"""eBPF: one loader per program, named after it (bpf/<name>.bpf.c of the checkout's top level is
loaded by <name>.py here, on what loader.py shares; loader.programs_dir() finds the C sources), the
host's BPF features, and the policy controller that acts on the programs' events.

May import: arms (the data), cgroups/ (host layout, nodes) and traces/. Never metrics/ or anything above.
"""
