"""eBPF: one loader per program (bpf/programs/, one C source per program), the host's BPF features, and
the policy controller that acts on the programs' events.

May import: cgroups/ (host layout, nodes, arms) and traces/. Never metrics/ or anything above.
"""
