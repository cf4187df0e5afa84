/* Shared by the agentcgroup BPF programs (bcc). Every program function is named agcg_* so that
 * `bpftool prog show` can tell ours apart (the kernel keeps the first 15 characters of the name).
 *
 * No kernel structs are read anywhere: the running kernel need not match the installed headers,
 * so tracepoint contexts are declared here from /sys/kernel/tracing/events/<x>/<y>/format. */
#ifndef AGCG_COMMON_H
#define AGCG_COMMON_H

#define AGCG_SIGSTOP 19

/* the 8 bytes of common_* fields every tracepoint record starts with */
#define AGCG_TP_COMMON u64 __common;

#endif
