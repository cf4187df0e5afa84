/* egress_policy: cgroup_skb/egress filter for a step's v2 cgroup. Replayed commands get no network
 * by default: a packet leaves only if its IPv4 destination is in `agcg_egr_allow`, or it goes to
 * loopback (127.0.0.0/8, ::1) and the config says loopback is allowed. Everything else (other
 * IPv4, all other IPv6) is dropped and counted per cgroup.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>

struct egr_config {
    u32 allow_loopback;
    u32 __pad;
};

struct egr_counts {
    u64 allowed;
    u64 dropped;
    u64 last_drop_ns;
    u32 last_drop_daddr;   /* IPv4, network order; 0 for IPv6 */
    u32 __pad;
};

BPF_ARRAY(agcg_egr_config, struct egr_config, 1);
BPF_HASH(agcg_egr_allow, u32, u8, 1024);             /* IPv4 daddr (network order) -> 1 */
BPF_HASH(agcg_egr_counts, u64, struct egr_counts, 4096);

static __always_inline int verdict(struct __sk_buff *skb, int allow, u32 daddr) {
    u64 cg = bpf_skb_cgroup_id(skb);
    struct egr_counts zero = {};
    struct egr_counts *c = agcg_egr_counts.lookup_or_try_init(&cg, &zero);
    if (c) {
        if (allow) {
            __sync_fetch_and_add(&c->allowed, 1);
        } else {
            __sync_fetch_and_add(&c->dropped, 1);
            c->last_drop_ns = bpf_ktime_get_ns();
            c->last_drop_daddr = daddr;
        }
    }
    return allow ? 1 : 0;
}

int agcg_egress(struct __sk_buff *skb) {
    int zero = 0;
    struct egr_config *cfg = agcg_egr_config.lookup(&zero);
    u32 allow_lo = cfg ? cfg->allow_loopback : 0;
    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr ip;
        if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
            return verdict(skb, 0, 0);
        u32 daddr = ip.daddr;
        if ((bpf_ntohl(daddr) >> 24) == 127)
            return verdict(skb, allow_lo, daddr);
        return verdict(skb, agcg_egr_allow.lookup(&daddr) != 0, daddr);
    }
    if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr ip6;
        if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
            return verdict(skb, 0, 0);
        u32 *w = (u32 *)&ip6.daddr;
        int is_lo = w[0] == 0 && w[1] == 0 && w[2] == 0 && w[3] == bpf_htonl(1);
        return verdict(skb, is_lo && allow_lo, 0);
    }
    return verdict(skb, 0, 0);
}
