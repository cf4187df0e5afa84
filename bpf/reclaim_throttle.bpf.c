/* reclaim_throttle: stop the allocating task, inside the kernel, when its cgroup starts memcg
 * reclaim and user space marked that cgroup low-priority.
 *
 * `agcg_thr_cgs` maps a v2 cgroup id to a policy:
 *   mode  AGCG_THR_RECORD  stamp the trigger only (an onset clock for other controllers)
 *         AGCG_THR_NOTIFY  stamp + ring-buffer event; user space acts
 *         AGCG_THR_STOP    stamp + bpf_send_signal(SIGSTOP) to the allocating process + event
 *   armed  1 = react to the next reclaim; cleared when it fires, so one pressure episode gives one
 *          action; user space re-arms after it resumed the cgroup (the hold time is its business).
 * Every reaction is stamped with the kernel time of the trigger (tracepoint entry) and of the
 * action (after bpf_send_signal returned, i.e. the signal is queued); sched_switch then stamps
 * when the stopped task actually left the CPU (`stopped_ns`).
 */
#include <uapi/linux/ptrace.h>
#include "common.h"

enum { AGCG_THR_RECORD = 0, AGCG_THR_NOTIFY = 1, AGCG_THR_STOP = 2 };

struct thr_policy {
    u64 mode;
    u64 armed;           /* 64-bit: the BPF backend has no 32-bit compare-and-swap */
    u64 trigger_ns;      /* last trigger (0 = none yet) */
    u64 action_ns;
    u64 stopped_ns;
    u32 pid;             /* process that was signalled */
    u32 tid;
    u64 triggers;        /* reclaims seen while armed */
    u64 reclaims;        /* all reclaims seen */
    s64 signal_ret;
};

struct thr_event {
    u64 cgroup_id;
    u64 trigger_ns;
    u64 action_ns;       /* 0 when no in-kernel action (notify mode) */
    u32 pid;
    u32 tid;
    u32 mode;
    s32 signal_ret;
};

BPF_HASH(agcg_thr_cgs, u64, struct thr_policy, 4096);
BPF_HASH(agcg_thr_pending, u32, u64, 1024);     /* tid signalled -> its cgroup id */
BPF_RINGBUF_OUTPUT(agcg_thr_events, 16);

struct reclaim_begin_args { AGCG_TP_COMMON int order; int __pad; unsigned long gfp_flags; };

int agcg_thr_reclaim(struct reclaim_begin_args *args) {
    u64 trigger = bpf_ktime_get_ns();
    u64 cg = bpf_get_current_cgroup_id();
    struct thr_policy *p = agcg_thr_cgs.lookup(&cg);
    if (!p)
        return 0;
    __sync_fetch_and_add(&p->reclaims, 1);
    if (!__sync_bool_compare_and_swap(&p->armed, 1, 0))
        return 0;
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tid = (u32)pid_tgid;
    u64 action = 0;
    long ret = 0;
    if (p->mode == AGCG_THR_STOP) {
        ret = bpf_send_signal(AGCG_SIGSTOP);
        action = bpf_ktime_get_ns();
        agcg_thr_pending.update(&tid, &cg);
    }
    p->trigger_ns = trigger;
    p->action_ns = action;
    p->stopped_ns = 0;
    p->pid = pid_tgid >> 32;
    p->tid = tid;
    p->signal_ret = ret;
    __sync_fetch_and_add(&p->triggers, 1);
    if (p->mode == AGCG_THR_RECORD)
        return 0;
    struct thr_event *e = agcg_thr_events.ringbuf_reserve(sizeof(*e));
    if (!e)
        return 0;
    e->cgroup_id = cg; e->trigger_ns = trigger; e->action_ns = action;
    e->pid = pid_tgid >> 32; e->tid = tid; e->mode = p->mode; e->signal_ret = ret;
    agcg_thr_events.ringbuf_submit(e, 0);
    return 0;
}

struct switch_args {
    AGCG_TP_COMMON char prev_comm[16]; int prev_pid; int prev_prio; long prev_state;
    char next_comm[16]; int next_pid; int next_prio;
};

int agcg_thr_switch(struct switch_args *args) {
    if (!(args->prev_state & 4))                   /* __TASK_STOPPED */
        return 0;
    u32 tid = args->prev_pid;
    u64 *cg = agcg_thr_pending.lookup(&tid);
    if (!cg)
        return 0;
    u64 key = *cg;
    struct thr_policy *p = agcg_thr_cgs.lookup(&key);
    if (p && p->stopped_ns == 0)
        p->stopped_ns = bpf_ktime_get_ns();
    agcg_thr_pending.delete(&tid);
    return 0;
}
