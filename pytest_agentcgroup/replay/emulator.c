/* Resource emulator: reproduces one step's recorded profile in a fresh process.
 *
 *   emulator PEAK_BYTES RAMP_MS CPU_MS IO_BYTES DURATION_MS WORKDIR [ALLOC_LOG] [--curve=FILE]
 *
 * A C program so that its start-up stays well below the shortest recorded step (a sandboxed `ls`),
 * which an interpreter's start-up alone would not. The emulate executor compiles it on
 * first use (replay/emulator_build.py). Its schedule is a pure function of its arguments (plus the
 * start-up baseline it measures and subtracts).
 *
 * Without a curve (a derived or synthetic profile), over DURATION_MS of wall time from its start-up:
 *   1. ramp: memory grows in equal chunks to PEAK_BYTES over RAMP_MS; every page is written, so the
 *      kernel really charges it to the cgroup (and really OOM-kills us at a hard limit);
 *   2. IO: IO_BYTES written to a file in WORKDIR and read back (page cache is charged to the cgroup
 *      too, as for a real tool), then removed;
 *   3. hold: the memory stays resident until DURATION_MS has passed.
 * Our own resident size is subtracted from PEAK_BYTES so the cgroup's peak matches it.
 *
 * With --curve=FILE (a recorded curve: lines `T_MS MB`, the memory of the recorded step's cgroup T_MS
 * after it was spawned), memory follows the curve instead, each reading from its time until the next
 * one's, in whole MiB of anonymous mappings (munmap and MADV_DONTNEED really uncharge them): a step
 * that released memory or peaked twice does so here too. The clock starts at the spawn, as the
 * recording's did (AGENTCGROUP_EMULATE_T0 in the environment: the launcher's CLOCK_MONOTONIC just
 * before it; else estimated), not at the end of our start-up. What the cgroup holds when we begin
 * (this process, the CPU workers; our RSS where the cgroup holds other processes too) is subtracted
 * once. IO comes first, 1 MiB at a time, truncated after each piece: the curve already contains the
 * recorded step's page cache.
 *
 * CPU: CPU_MS of CPU in total, paid pro rata over DURATION_MS. What is owed is carried forward: when
 * allocating fell behind the schedule, the CPU not yet spent is spent later (at the latest after the
 * last deadline), never dropped. The CPU this process already used (start-up, page faults) counts, as
 * it does in the recorded step's cgroup. When the CPU still owed after start-up exceeds the time left
 * (a step that used several cores), it is shared among as many processes as it needs (forked
 * workers, at most one per CPU this process may run on; each counts against pids.max). A fork
 * that fails (pids.max, memory) leaves the CPU to the processes already running: the step runs longer.
 *
 * With ALLOC_LOG, memory is allocated in 1 MiB pieces and the wall time of each (map + touch every
 * page: the page faults that charge it to the cgroup; not the pacing after it) is appended to that
 * file in ms, one line per MiB, written as it happens (a kill loses nothing written before it): the
 * allocation latency Experiment 5 reports.
 *
 * Exit codes: 0 done; 2 bad arguments or an unreadable curve (named on stderr); 1 a system call
 * failed (named on stderr). The kernel's OOM kill ends it with SIGKILL.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024L * 1024L)
#define CHUNK (8 * MIB)
#define T0_ENV "AGENTCGROUP_EMULATE_T0"   /* monotonic seconds just before the spawn (optional) */
#define WORKER_SLICE_S 0.02               /* a CPU worker settles its account this often */
#define MAX_WORKERS 256
#define MAX_BYTES ((double)(1L << 46))    /* 64 TiB: any size above is a corrupt profile, refused */
#define MAX_MS 1e9                        /* ~11.6 days: any time above is refused, likewise */

static long page_size;
static int log_fd = -1;                   /* ALLOC_LOG, or -1 */

static void die(int code, const char *what, const char *name)
{
    fprintf(stderr, "emulator: %s%s%s: %s\n", what, name ? " " : "", name ? name : "", strerror(errno));
    _exit(code);
}

/* A write that returned fewer bytes than asked (errno is not set then) or failed. */
static void die_write(ssize_t got, const char *what, const char *name)
{
    if (got >= 0) {
        fprintf(stderr, "emulator: %s%s%s: short write\n", what, name ? " " : "", name ? name : "");
        _exit(1);
    }
    die(1, what, name);
}

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }
static double cpu_used_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static void sleep_until(double t)
{
    struct timespec ts = { (time_t)t, (long)((t - (time_t)t) * 1e9) };
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

static long rss_bytes(void)
{
    long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &resident) != 2)
            resident = 0;
        fclose(f);
    }
    return resident * page_size;
}

/* Write one byte in every page of [lo, hi): the page faults make the kernel charge it. */
static void touch(char *lo, char *hi)
{
    for (volatile char *p = lo; p < hi; p += page_size)
        *p = 1;
}

/* ---- the cgroup's own usage, when the cgroup is ours alone ----------------------------------- */

static int only_ours(const char *procs_path, const pid_t *ours, int n)
{
    FILE *f = fopen(procs_path, "r");
    long pid;
    int ok = 1;
    if (!f)
        return -1;
    while (ok && fscanf(f, "%ld", &pid) == 1) {
        int found = 0;
        for (int i = 0; i < n; i++)
            found |= pid == ours[i];
        ok = found;
    }
    fclose(f);
    return ok;
}

static int has_word(const char *list, const char *word)       /* in a comma-separated list */
{
    size_t n = strlen(word);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, word, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

/* What this process's memory cgroup holds now (v1 memory.usage_in_bytes | v2 memory.current) when
 * no process but `ours` is in it; -1 where it is shared or its files cannot be read (then RSS
 * stands in). */
static long cgroup_usage(const pid_t *ours, int n)
{
    char line[4096], mline[4096], path[8192];
    long usage = -1;
    FILE *cg = fopen("/proc/self/cgroup", "r");
    if (!cg)
        return -1;
    while (usage < 0 && fgets(line, sizeof line, cg)) {
        char *ctrls = strchr(line, ':'), *cgpath;
        if (!ctrls || !(cgpath = strchr(ctrls + 1, ':')))
            continue;
        *ctrls++ = '\0';
        *cgpath++ = '\0';
        cgpath[strcspn(cgpath, "\n")] = '\0';
        int v2 = *ctrls == '\0';
        FILE *mi = fopen("/proc/self/mountinfo", "r");
        if (!mi)
            break;
        while (usage < 0 && fgets(mline, sizeof mline, mi)) {
            char root[1024], mnt[1024], fstype[64], source[1024], super[1024];
            char *sep = strstr(mline, " - ");
            if (!sep || sscanf(mline, "%*s %*s %*s %1023s %1023s", root, mnt) != 2
                || sscanf(sep + 3, "%63s %1023s %1023s", fstype, source, super) != 3)
                continue;
            int mine = v2 ? strcmp(fstype, "cgroup2") == 0
                          : strcmp(fstype, "cgroup") == 0 && has_word(super, "memory") && has_word(ctrls, "memory");
            if (!mine)
                continue;
            size_t rl = strlen(root);
            const char *rel = strcmp(root, "/") != 0 && strncmp(cgpath, root, rl) == 0 ? cgpath + rl : cgpath;
            snprintf(path, sizeof path, "%s%s/cgroup.procs", mnt, rel);
            int alone = only_ours(path, ours, n);
            if (alone < 0)                          /* not readable here: another mount may be */
                continue;
            if (alone == 0) {                       /* someone else in it: shared */
                fclose(mi);
                fclose(cg);
                return -1;
            }
            snprintf(path, sizeof path, "%s%s/%s", mnt, rel, v2 ? "memory.current" : "memory.usage_in_bytes");
            FILE *f = fopen(path, "r");
            if (f) {
                if (fscanf(f, "%ld", &usage) != 1)
                    usage = -1;
                fclose(f);
            }
        }
        fclose(mi);
    }
    fclose(cg);
    return usage;
}

/* The time since this process was forked: from the instant its launcher passed in T0_ENV (just
 * before the spawn), else a lower bound: its CPU time so far, or the clock since its start time in
 * /proc/self/stat (clock ticks, rounded down: one tick is subtracted). */
static double since_spawn_s(void)
{
    const char *env = getenv(T0_ENV);
    char *end, buf[2048];
    if (env && *env) {
        double t0 = strtod(env, &end);
        if (*end == '\0')
            return fmax(0.0, now_s() - t0);
    }
    double best = cpu_used_s();
    FILE *f = fopen("/proc/self/stat", "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
        char *p = strrchr(buf, ')');
        unsigned long long ticks;
        /* after the command: state is field 3, starttime field 22 (19 fields on) */
        if (p && sscanf(p + 2, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                        &ticks) == 1)
            best = fmax(best, clock_s(CLOCK_BOOTTIME) - (ticks + 1.0) / sysconf(_SC_CLK_TCK));
    }
    return best;
}

/* ---- CPU ------------------------------------------------------------------------------------- */

struct cpu { double total, duration; };    /* owed pro rata over the step; the account: our CPU time */

/* Spin until the CPU owed at t_s (of the step) is spent, or the monotonic deadline passes (a
 * deadline < 0: none, the debt is paid in full). */
static void cpu_pay(const struct cpu *c, double t_s, double deadline)
{
    double owed = c->duration > 0 ? c->total * fmin(1.0, t_s / c->duration) : c->total;
    while (cpu_used_s() < owed) {
        if (deadline >= 0 && now_s() >= deadline)
            return;
        /* tens of microseconds of user-mode work between the clock reads (each a system call),
           so the CPU is mostly user time, as a program's is */
        for (volatile unsigned i = 0; i < 20000; i++)
            ;
    }
}

/* Pay the CPU owed by t_s, then sleep until t_s (a late schedule carries its debt on). */
static void pace(const struct cpu *c, double t0, double t_s)
{
    cpu_pay(c, t_s, t0 + t_s);
    sleep_until(t0 + t_s);
}

/* Fork the CPU workers a multi-core step needs: as many processes as the CPU still owed needs in
 * the time still left (start-up has used some of both). Returns this process's share (its CPU so
 * far included); the workers' pids go to `pids`, their number to `*n`. */
static double start_workers(double cpu_s, double duration_s, double t0, pid_t *pids, int *nworkers)
{
    double used = cpu_used_s(), left = duration_s - (now_s() - t0);
    *nworkers = 0;
    if (duration_s <= 0 || cpu_s - used <= fmax(left, 0.0))
        return cpu_s;
    cpu_set_t allowed;                  /* the CPUs we may run on, not those the machine has */
    long cores = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed)
                                                                      : sysconf(_SC_NPROCESSORS_ONLN);
    long n = (long)ceil((cpu_s - used) / fmax(left, 1e-3));
    if (n > cores)
        n = cores > 0 ? cores : 1;
    if (n > MAX_WORKERS + 1)
        n = MAX_WORKERS + 1;
    double share = (cpu_s - used) / n;
    pid_t parent = getpid();
    for (long i = 0; i < n - 1; i++) {
        pid_t pid = fork();
        if (pid < 0)            /* pids.max or memory: go on with the workers we have (the step runs longer) */
            break;
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            struct cpu work = { share, duration_s };
            for (double t = 0.0; t < duration_s && getppid() == parent;) {
                t = fmin(duration_s, t + WORKER_SLICE_S);
                pace(&work, t0, t);
            }
            if (getppid() == parent)
                cpu_pay(&work, duration_s, -1);
            _exit(0);
        }
        pids[(*nworkers)++] = pid;
    }
    return cpu_s - share * *nworkers;   /* ours: what the workers forked do not pay */
}

/* ---- IO -------------------------------------------------------------------------------------- */

static void do_io(const char *workdir, long nbytes, int bounded)
{
    static char block[MIB];
    char path[4096];
    snprintf(path, sizeof path, "%s/.emulator-io-%d", workdir, (int)getpid());
    memset(block, 2, sizeof block);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die(1, "cannot create", path);
    for (long left = nbytes; left > 0;) {
        ssize_t n = write(fd, block, left < MIB ? left : MIB);
        if (n <= 0)
            die_write(n, "cannot write", path);
        left -= n;
        if (bounded) {          /* read the piece back, then drop it: at most 1 MiB of page cache */
            if (pread(fd, block, n, 0) < 0 || ftruncate(fd, 0) < 0 || lseek(fd, 0, SEEK_SET) < 0)
                die(1, "cannot read back", path);
        }
    }
    if (!bounded) {
        lseek(fd, 0, SEEK_SET);
        while (read(fd, block, MIB) > 0)
            ;
    }
    close(fd);
    unlink(path);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static char *map_anon(long size)
{
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die(1, "mmap", NULL);
    return p;
}

static void log_alloc(double ms)
{
    char line[32];
    int len = snprintf(line, sizeof line, "%.3f\n", ms);
    ssize_t got = write(log_fd, line, len);
    if (got != len)
        die_write(got, "cannot write the allocation log", NULL);
}

/* Touch [lo, hi) in 1 MiB pieces, each timed into the ALLOC_LOG; or at once without one. map_s: the
 * time the mmap of this range took, counted in its first piece (as the ramp's pieces count theirs). */
static void charge(char *lo, char *hi, double map_s)
{
    if (log_fd < 0) {
        touch(lo, hi);
        return;
    }
    for (char *a = lo; a < hi; a += MIB) {
        double t = now_s();
        touch(a, hi - a < MIB ? hi : a + MIB);
        log_alloc((now_s() - t + map_s) * 1000.0);
        map_s = 0.0;
    }
}

/* Memory held in anonymous mappings, grown and shrunk to a target in whole MiB: a rise maps one
 * region of its size, a fall unmaps whole regions and gives back the tail of the last one
 * (MADV_DONTNEED uncharges it), so that rises and falls cost what a real program's would. */
struct region { char *addr; long len, resident; };
static struct region *regions;
static long nregions, cap_regions, held;

static void hold(double nbytes)
{
    double map_s = 0.0;
    long want = (long)fmin(MAX_BYTES / MIB, fmax(0.0, floor((nbytes + MIB / 2) / MIB))) * MIB;
    while (held < want) {
        struct region *last = nregions ? &regions[nregions - 1] : NULL;
        if (!last || last->resident == last->len) {
            if (nregions == cap_regions) {
                cap_regions = cap_regions ? 2 * cap_regions : 64;
                if (!(regions = realloc(regions, cap_regions * sizeof *regions)))
                    die(1, "realloc", NULL);
            }
            double t = now_s();
            last = &regions[nregions++];
            *last = (struct region){ map_anon(want - held), want - held, 0 };
            map_s = now_s() - t;
        }
        long grow = want - held < last->len - last->resident ? want - held : last->len - last->resident;
        charge(last->addr + last->resident, last->addr + last->resident + grow, map_s);
        map_s = 0.0;
        last->resident += grow;
        held += grow;
    }
    while (held > want && nregions) {
        struct region *last = &regions[nregions - 1];
        long keep = last->resident - (held - want);
        if (keep < 0)
            keep = 0;
        if (keep == 0) {
            munmap(last->addr, last->len);
            nregions--;
        } else {
            madvise(last->addr + keep, last->resident - keep, MADV_DONTNEED);
        }
        held -= last->resident - keep;
        last->resident = keep;
    }
}

/* ---- the two schedules ----------------------------------------------------------------------- */

struct point { double t_s, bytes; };

static void bad_line(const char *path, long line, const char *why)
{
    fprintf(stderr, "emulator: the curve %s: line %ld %s\n", path, line, why);
    _exit(2);
}

/* The curve, one `T_MS MB` a line (blank lines skipped); a malformed line is refused, named. */
static struct point *read_curve(const char *path, long *n)
{
    FILE *f = fopen(path, "r");
    struct point *pts = NULL;
    long cap = 0, lineno = 0;
    char line[256];
    if (!f)
        die(2, "cannot read the curve", path);
    *n = 0;
    while (fgets(line, sizeof line, f)) {
        double t, mb;
        int end = 0;
        lineno++;
        if (!strchr(line, '\n') && !feof(f))
            bad_line(path, lineno, "is too long");
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        if (sscanf(line, "%lf %lf %n", &t, &mb, &end) != 2 || line[end] != '\0')
            bad_line(path, lineno, "is not `T_MS MB`");
        if (!isfinite(t) || !isfinite(mb) || t < 0 || mb < 0 || t > MAX_MS || mb * MIB > MAX_BYTES)
            bad_line(path, lineno, "is out of range (T_MS in 0..1e9, MB in 0..2^26)");
        if (*n == cap) {
            cap = cap ? 2 * cap : 256;
            if (!(pts = realloc(pts, cap * sizeof *pts)))
                die(1, "realloc", NULL);
        }
        pts[(*n)++] = (struct point){ t / 1000.0, mb * MIB };
    }
    if (ferror(f))
        die(2, "cannot read the curve", path);
    fclose(f);
    return pts;
}

static void follow_curve(const struct point *curve, long n, const struct cpu *cpu, double t0,
                         double duration_s, long io_bytes, const char *workdir, const pid_t *workers, int nworkers)
{
    pid_t ours[MAX_WORKERS + 1];
    if (io_bytes > 0)
        do_io(workdir, io_bytes, 1);
    ours[0] = getpid();
    memcpy(ours + 1, workers, nworkers * sizeof *workers);
    long base = cgroup_usage(ours, nworkers + 1);
    if (base < 0)
        base = rss_bytes();
    for (long i = 0; i < n; i++) {     /* a reading holds from its time until the next one's */
        pace(cpu, t0, fmin(curve[i].t_s, duration_s));
        hold(curve[i].bytes - base);
    }
    pace(cpu, t0, duration_s);
}

static void ramp_and_hold(double peak, double ramp_s, const struct cpu *cpu, double t0, double duration_s,
                          long io_bytes, const char *workdir)
{
    double rss = rss_bytes();           /* in double: peak is at most MAX_BYTES (checked), the cast safe */
    long target = peak > rss ? (long)(peak - rss) : 0;
    long nchunks = (target + CHUNK - 1) / CHUNK;
    for (long i = 0; i < nchunks; i++) {
        long size = target - i * CHUNK < CHUNK ? target - i * CHUNK : CHUNK;
        if (log_fd < 0) {
            char *buf = map_anon(size);
            touch(buf, buf + size);
        } else {
            for (long lo = 0; lo < size; lo += MIB) {    /* the same in 1 MiB pieces, each timed */
                long piece = size - lo < MIB ? size - lo : MIB;
                double t = now_s();
                char *buf = map_anon(piece);
                touch(buf, buf + piece);
                log_alloc((now_s() - t) * 1000.0);
            }
        }
        pace(cpu, t0, ramp_s * (i + 1) / nchunks);
    }
    if (io_bytes > 0)
        do_io(workdir, io_bytes, 0);
    pace(cpu, t0, duration_s);
}

static double number(const char *arg, const char *name, double max)
{
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (end == arg || *end != '\0' || errno || !isfinite(v) || v < 0) {
        fprintf(stderr, "emulator: %s must be a number >= 0, got '%s'\n", name, arg);
        _exit(2);
    }
    if (v > max) {          /* compared as a double: a cast of 1e30 to long would be LONG_MIN */
        fprintf(stderr, "emulator: %s must be at most %.0f, got '%s'\n", name, max, arg);
        _exit(2);
    }
    return v;
}

int main(int argc, char **argv)
{
    const char *curve_path = NULL, *log_path = NULL;
    page_size = sysconf(_SC_PAGESIZE);
    if (argc < 7) {
        fprintf(stderr, "usage: %s PEAK_BYTES RAMP_MS CPU_MS IO_BYTES DURATION_MS WORKDIR [ALLOC_LOG] "
                        "[--curve=FILE]\n", argv[0]);
        return 2;
    }
    double peak = number(argv[1], "PEAK_BYTES", MAX_BYTES), ramp_ms = number(argv[2], "RAMP_MS", MAX_MS);
    double cpu_ms = number(argv[3], "CPU_MS", MAX_MS), io = number(argv[4], "IO_BYTES", MAX_BYTES);
    double duration_ms = number(argv[5], "DURATION_MS", MAX_MS);
    const char *workdir = argv[6];
    for (int i = 7; i < argc; i++) {    /* [ALLOC_LOG] [--curve=FILE], in either order (a caller may append the log) */
        const char *why = NULL;
        if (strncmp(argv[i], "--curve=", 8) == 0 && !curve_path)
            curve_path = argv[i] + 8;
        else if (strncmp(argv[i], "--curve=", 8) == 0)
            why = "a second --curve";
        else if (strncmp(argv[i], "--", 2) == 0)
            why = "an unknown option";
        else if (!log_path)
            log_path = argv[i];
        else
            why = "an extra argument";
        if (why) {
            fprintf(stderr, "emulator: '%s' is %s (usage: PEAK_BYTES RAMP_MS CPU_MS IO_BYTES DURATION_MS WORKDIR "
                            "[ALLOC_LOG] [--curve=FILE])\n", argv[i], why);
            return 2;
        }
    }
    if (log_path && (log_fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666)) < 0)
        die(1, "cannot open the allocation log", log_path);
    long npoints = 0;
    struct point *curve = curve_path ? read_curve(curve_path, &npoints) : NULL;
    double duration = duration_ms / 1000.0;
    /* a recorded curve's clock starts at the spawn; a derived profile's once we run */
    double t0 = now_s() - (curve ? since_spawn_s() : 0.0);
    pid_t workers[MAX_WORKERS];
    int nworkers;
    struct cpu cpu = { start_workers(cpu_ms / 1000.0, duration, t0, workers, &nworkers), duration };
    if (curve)
        follow_curve(curve, npoints, &cpu, t0, duration, (long)io, workdir, workers, nworkers);
    else
        ramp_and_hold(peak, fmin(ramp_ms, duration_ms) / 1000.0, &cpu, t0, duration, (long)io, workdir);
    cpu_pay(&cpu, duration, -1);      /* whatever is still owed: late, but not lost */
    for (int i = 0; i < nworkers; i++)
        waitpid(workers[i], NULL, 0);
    return 0;
}
