/* memcg_observer: per-cgroup (v2 id) memory-pressure and scheduling observer.
 *
 * Watches only cgroups whose v2 id is a key of `agcg_obs_cgs` (set from user space), so the
 * cost on other tasks is one map lookup. Counts, per cgroup:
 *   - memcg reclaim begin/end (vmscan:mm_vmscan_memcg_reclaim_*; fires on v1 limit reclaim and
 *     v2 memory.max/high reclaim) and the total/max time spent in reclaim
 *   - OOM victims (oom:mark_victim, attributed to the cgroup of the task that ran the OOM killer,
 *     which for a memcg OOM is the allocating task inside the limited cgroup)
 *   - user page faults (the raw tracepoint page_fault_user), when compiled with -DAGCG_PGFAULT,
 *     in a per-CPU map of their own: one lookup and a plain add on the hottest path
 *   - run-queue latency (sched_wakeup/sched_wakeup_new/sched_switch) as a log2 histogram
 * and sends reclaim-begin / reclaim-end / OOM events with bpf_ktime_get_ns() (CLOCK_MONOTONIC)
 * to the ring buffer `agcg_obs_events`.
 */
#include <uapi/linux/ptrace.h>
#include "common.h"

enum { EV_RECLAIM_BEGIN = 1, EV_RECLAIM_END = 2, EV_OOM_VICTIM = 3 };

struct obs_stats {
    u64 reclaim_begin;
    u64 reclaim_end;
    u64 reclaim_ns_total;
    u64 reclaim_ns_max;
    u64 reclaimed_pages;
    u64 oom_victims;
    u64 first_reclaim_ns;
    u64 last_reclaim_ns;
};

struct obs_event {
    u64 ts_ns;
    u64 cgroup_id;
    u32 kind;
    u32 pid;          /* the task that hit the event; for OOM: the victim */
    u64 value;        /* reclaim end: ns spent; oom: victim anon rss (kB); begin: order */
};

struct hist_key {
    u64 cgroup_id;
    u64 slot;         /* log2(run-queue latency in us) */
};

BPF_HASH(agcg_obs_cgs, u64, u32, 4096);               /* cgroups to watch (value unused) */
BPF_HASH(agcg_obs_stats, u64, struct obs_stats, 4096);
BPF_HASH(agcg_obs_rcl_start, u32, u64, 10240);        /* tid -> reclaim begin ts */
BPF_TABLE("lru_hash", u32, u64, agcg_obs_task_cg, 65536);          /* tid -> cgroup id, learnt while it ran */
BPF_TABLE("lru_hash", u32, u64, agcg_obs_enq, 65536);              /* tid -> enqueue ts */
BPF_HASH(agcg_obs_runq, struct hist_key, u64, 8192);
BPF_RINGBUF_OUTPUT(agcg_obs_events, 64);

static __always_inline struct obs_stats *watched_stats(u64 cg) {
    if (!agcg_obs_cgs.lookup(&cg))
        return 0;
    struct obs_stats zero = {};
    return agcg_obs_stats.lookup_or_try_init(&cg, &zero);
}

static __always_inline void emit(u32 kind, u64 ts, u64 cg, u32 pid, u64 value) {
    struct obs_event *e = agcg_obs_events.ringbuf_reserve(sizeof(*e));
    if (!e)
        return;
    e->ts_ns = ts; e->cgroup_id = cg; e->kind = kind; e->pid = pid; e->value = value;
    agcg_obs_events.ringbuf_submit(e, 0);
}

struct reclaim_begin_args { AGCG_TP_COMMON int order; int __pad; unsigned long gfp_flags; };
struct reclaim_end_args { AGCG_TP_COMMON unsigned long nr_reclaimed; };

int agcg_obs_rcl_beg(struct reclaim_begin_args *args) {
    u64 ts = bpf_ktime_get_ns();
    u64 cg = bpf_get_current_cgroup_id();
    struct obs_stats *st = watched_stats(cg);
    if (!st)
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    __sync_fetch_and_add(&st->reclaim_begin, 1);
    if (st->first_reclaim_ns == 0)
        st->first_reclaim_ns = ts;
    st->last_reclaim_ns = ts;
    agcg_obs_rcl_start.update(&tid, &ts);
    emit(EV_RECLAIM_BEGIN, ts, cg, bpf_get_current_pid_tgid() >> 32, args->order);
    return 0;
}

int agcg_obs_rcl_end(struct reclaim_end_args *args) {
    u64 ts = bpf_ktime_get_ns();
    u64 cg = bpf_get_current_cgroup_id();
    struct obs_stats *st = watched_stats(cg);
    if (!st)
        return 0;
    u32 tid = (u32)bpf_get_current_pid_tgid();
    u64 spent = 0;
    u64 *start = agcg_obs_rcl_start.lookup(&tid);
    if (start) {
        spent = ts - *start;
        agcg_obs_rcl_start.delete(&tid);
    }
    __sync_fetch_and_add(&st->reclaim_end, 1);
    __sync_fetch_and_add(&st->reclaim_ns_total, spent);
    __sync_fetch_and_add(&st->reclaimed_pages, args->nr_reclaimed);
    if (spent > st->reclaim_ns_max)
        st->reclaim_ns_max = spent;
    emit(EV_RECLAIM_END, ts, cg, bpf_get_current_pid_tgid() >> 32, spent);
    return 0;
}

struct mark_victim_args {
    AGCG_TP_COMMON int pid; u32 comm_loc; unsigned long total_vm; unsigned long anon_rss;
};

int agcg_obs_oom(struct mark_victim_args *args) {
    u64 ts = bpf_ktime_get_ns();
    u64 cg = bpf_get_current_cgroup_id();
    struct obs_stats *st = watched_stats(cg);
    if (!st)
        return 0;
    __sync_fetch_and_add(&st->oom_victims, 1);
    emit(EV_OOM_VICTIM, ts, cg, args->pid, args->anon_rss);
    return 0;
}

#ifdef AGCG_PGFAULT
/* watched cgroup -> its user page faults on each CPU (user space adds a watched cgroup's key and
 * sums the CPUs): no second lookup, no atomic add shared between CPUs on every fault */
BPF_PERCPU_HASH(agcg_obs_pgf, u64, u64, 4096);

int agcg_obs_pgfault(struct bpf_raw_tracepoint_args *ctx) {
    u64 cg = bpf_get_current_cgroup_id();
    u64 *faults = agcg_obs_pgf.lookup(&cg);
    if (faults)
        *faults += 1;
    return 0;
}
#endif

/* run-queue latency: a task's cgroup is learnt while it runs (at switch-out, when it is `current`),
 * because the wakeup/switch tracepoints run in another task's context and give only a pid. */
struct wakeup_args { AGCG_TP_COMMON char comm[16]; int pid; int prio; int target_cpu; };
struct switch_args {
    AGCG_TP_COMMON char prev_comm[16]; int prev_pid; int prev_prio; long prev_state;
    char next_comm[16]; int next_pid; int next_prio;
};

static __always_inline void enqueued(u32 tid) {
    if (!agcg_obs_task_cg.lookup(&tid))
        return;
    u64 ts = bpf_ktime_get_ns();
    agcg_obs_enq.update(&tid, &ts);
}

int agcg_obs_wakeup(struct wakeup_args *args) {
    enqueued(args->pid);
    return 0;
}

int agcg_obs_switch(struct switch_args *args) {
    u32 prev = args->prev_pid, next = args->next_pid;
    u64 cg = bpf_get_current_cgroup_id();          /* current == prev here */
    if (prev != 0 && agcg_obs_cgs.lookup(&cg)) {
        agcg_obs_task_cg.update(&prev, &cg);
        if (args->prev_state == 0) {                /* preempted: straight back on the run queue */
            u64 ts = bpf_ktime_get_ns();
            agcg_obs_enq.update(&prev, &ts);
        }
    }
    u64 *enq = agcg_obs_enq.lookup(&next);
    if (!enq)
        return 0;
    u64 *ncg = agcg_obs_task_cg.lookup(&next);
    if (ncg) {
        u64 delta_us = (bpf_ktime_get_ns() - *enq) / 1000;
        struct hist_key key = {.cgroup_id = *ncg, .slot = bpf_log2l(delta_us + 1)};
        u64 zero = 0;
        u64 *cnt = agcg_obs_runq.lookup_or_try_init(&key, &zero);
        if (cnt)
            __sync_fetch_and_add(cnt, 1);
    }
    agcg_obs_enq.delete(&next);
    return 0;
}
