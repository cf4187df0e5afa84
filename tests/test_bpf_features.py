from pytest_agentcgroup.bpf import features

EXPECTED = {"root", "bcc", "bpf_syscall", "btf", "ringbuf", "tracefs", "cgroup_attach", "bpf_lsm",
            "sched_ext", "memcg_bpf_ops", "kprobes"}


def test_probe_reports_every_feature_with_a_reason():
    feats = features.probe()
    assert EXPECTED <= set(feats)
    for name, (ok, why) in feats.items():
        assert isinstance(ok, bool) and why, name
    assert features.missing("no-such-feature") == "no-such-feature: unknown feature"
    print(features.report())
