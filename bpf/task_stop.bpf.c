/* task_stop: when did a watched task actually stop, measured from when its memory pressure began?
 *
 * An observer only: it acts on nothing. Every exp2 controller (polling, PSI, ring buffer, in-kernel
 * bpf_send_signal) is measured by this one program, to the same two kernel-clock endpoints:
 *   onset  the first memcg reclaim the watched task entered (vmscan:mm_vmscan_memcg_reclaim_begin
 *          runs in the allocating task's own context)
 *   stop   the first time the task left the CPU in a stopped state (sched:sched_switch, prev_state
 *          & the mask in agcg_stop_mask). A signal is acted on when the task returns to user
 *          space, so this is when a SIGSTOP took effect, not when it was sent.
 * Which prev_state bits mean "stopped" changed across kernels, so user space probes them (SIGSTOP a
 * spinning child, read `last_state`) and writes the mask; until then nothing counts as a stop.
 *
 * Progress: the task may publish a u64 (bytes it has touched) at a user address (`progress_addr`).
 * It is read with bpf_probe_read_user at both endpoints, which run in the task's own context
 * (sched_switch fires before the context switch, so `current` is still the task switching out):
 * overshoot = progress at stop - progress at onset, with no user-space race.
 *
 * Where the time between onset and stop went (to explain a slow stop, not to measure it): the end
 * of the first reclaim, the time the task waited runnable off the CPU (switched out runnable, e.g.
 * preempted, until switched back in) and the time it was blocked (switched out sleeping).
 */
#include <uapi/linux/ptrace.h>
#include "common.h"

struct stop_watch {
    u64 progress_addr;   /* user address of the task's progress counter (0 = none) */
    u64 onset_ns;        /* first memcg reclaim entered (0 = none yet) */
    u64 onset_progress;
    u64 stop_ns;         /* first switch-out in a stopped state (0 = none yet) */
    u64 stop_progress;
    u64 stop_state;      /* prev_state at that switch-out */
    u64 last_state;      /* prev_state of the latest switch-out (to probe the encoding) */
    u64 switches;        /* switch-outs seen while watched */
    s64 read_err;        /* last bpf_probe_read_user error (0 = fine) */
    u64 onset_end_ns;    /* end of that first reclaim */
    u64 reclaims;        /* reclaims the task entered from onset until the stop */
    u64 runnable_ns;     /* onset..stop: off the CPU but runnable */
    u64 blocked_ns;      /* onset..stop: off the CPU sleeping */
    u64 out_ns;          /* the task's last switch-out (0 = on the CPU or stopped) */
    u64 out_state;       /* prev_state then */
};

BPF_HASH(agcg_stop_tasks, u32, struct stop_watch, 1024);   /* watched tid -> what was seen */
BPF_ARRAY(agcg_stop_mask, u64, 1);                         /* prev_state bits meaning stopped */

/* The compiler must not sink the stores above a stamp below it: user space polls the stamp and reads
 * the whole record once it is set (x86 keeps stores in order; this keeps clang from reordering them).
 * Without it a slow machine (a VM in software emulation) read stop_ns with stop_progress still 0. */
#define AGCG_STORES_BEFORE() asm volatile("" ::: "memory")

static __always_inline void read_progress(struct stop_watch *w, u64 *into) {
    if (!w->progress_addr)
        return;
    u64 v = 0;
    long err = bpf_probe_read_user(&v, sizeof(v), (void *)w->progress_addr);
    if (err)
        w->read_err = err;
    else
        *into = v;
}

struct reclaim_begin_args { AGCG_TP_COMMON int order; int __pad; unsigned long gfp_flags; };

int agcg_stop_onset(struct reclaim_begin_args *args) {
    u64 now = bpf_ktime_get_ns();
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct stop_watch *w = agcg_stop_tasks.lookup(&tid);
    if (!w)
        return 0;
    if (!w->stop_ns)
        w->reclaims += 1;
    if (w->onset_ns)            /* still recorded after a stop: a stop may come before any reclaim */
        return 0;
    read_progress(w, &w->onset_progress);
    AGCG_STORES_BEFORE();       /* onset_ns last: user space takes a set stamp to mean the record is whole */
    w->onset_ns = now;
    return 0;
}

struct reclaim_end_args { AGCG_TP_COMMON unsigned long nr_reclaimed; };

int agcg_stop_rcl_end(struct reclaim_end_args *args) {
    u64 now = bpf_ktime_get_ns();
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct stop_watch *w = agcg_stop_tasks.lookup(&tid);
    if (w && w->onset_ns && !w->onset_end_ns)
        w->onset_end_ns = now;
    return 0;
}

struct switch_args {
    AGCG_TP_COMMON char prev_comm[16]; int prev_pid; int prev_prio; long prev_state;
    char next_comm[16]; int next_pid; int next_prio;
};

/* `state` values that mean runnable: 0, possibly with the "preempted" flag above the state bits */
#define AGCG_STOP_RUNNABLE(state) (((state) & 0xff) == 0)

int agcg_stop_switch(struct switch_args *args) {
    u64 now = bpf_ktime_get_ns();
    u32 next = args->next_pid;
    struct stop_watch *in = agcg_stop_tasks.lookup(&next);
    if (in && in->out_ns) {                    /* a watched task back on the CPU */
        if (in->onset_ns && !in->stop_ns && in->out_ns >= in->onset_ns) {
            if (AGCG_STOP_RUNNABLE(in->out_state))
                in->runnable_ns += now - in->out_ns;
            else
                in->blocked_ns += now - in->out_ns;
        }
        in->out_ns = 0;
    }
    u32 tid = args->prev_pid;
    struct stop_watch *w = agcg_stop_tasks.lookup(&tid);
    if (!w)
        return 0;
    u64 state = args->prev_state;
    w->last_state = state;
    w->switches += 1;
    if (w->stop_ns)
        return 0;
    w->out_ns = now;
    w->out_state = state;
    u32 zero = 0;
    u64 *mask = agcg_stop_mask.lookup(&zero);
    if (!mask || !*mask || !(state & *mask))
        return 0;
    w->stop_state = state;
    w->out_ns = 0;
    read_progress(w, &w->stop_progress);
    AGCG_STORES_BEFORE();       /* stop_ns last: wait_stop returns as soon as it sees it */
    w->stop_ns = now;
    return 0;
}
