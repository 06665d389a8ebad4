"""The measured per-step VM/bare switch (`ms_dynvm.cost.step.StepSwitch`). Pure Python: no MindSpore."""

from ms_dynvm.cost.step import StepSwitch


def _steps(sw, key, n, vm_s, bare_s, gen=0):
    """n steps of `key`, each run as the switch decides and timed as given; the decisions."""
    out = []
    for _ in range(n):
        vm = sw.decide(key, gen)
        out.append(vm)
        sw.record(key, vm_s if vm else bare_s, vm, gen)
    return out


def test_learning_steps_run_under_the_vm_and_are_not_measurements():
    sw = StepSwitch()
    d = _steps(sw, "k", StepSwitch.LEARN, vm_s=9.0, bare_s=1.0)
    assert d == [True] * StepSwitch.LEARN
    k = sw.keys["k"]
    assert not k.vm and not k.bare


def test_a_key_where_the_vm_is_slower_goes_bare_and_probes_rarely():
    sw = StepSwitch()
    d = _steps(sw, "k", 600, vm_s=1.5, bare_s=1.0)
    assert not sw.is_on("k") and sw.flips == 1 and sw.bare_keys() == 1
    late = d[100:]
    # Probes back off: after the first confirming probes, at most about one step in 64 runs under
    # the VM (MAX_PROBE_EVERY = 256; random, so a loose bound).
    assert 0 < sum(late) <= len(late) // 32
    assert sw.keys["k"].every > StepSwitch.PROBE_EVERY


def test_a_key_where_the_vm_is_faster_stays_under_it():
    sw = StepSwitch()
    d = _steps(sw, "k", 400, vm_s=0.5, bare_s=1.0)
    assert sw.is_on("k") and sw.flips == 0
    late = d[100:]
    assert sum(not x for x in late) <= len(late) // 32


def test_sampling_picks_both_ways_before_deciding():
    sw = StepSwitch()
    _steps(sw, "k", 40, vm_s=1.0, bare_s=1.0)
    k = sw.keys["k"]
    assert len(k.vm) >= StepSwitch.MIN_SAMPLES and len(k.bare) >= StepSwitch.MIN_SAMPLES
    assert sw.is_on("k")  # equal times: within the hysteresis, the VM stays


def test_a_bare_key_switches_back_when_the_vm_becomes_faster():
    sw = StepSwitch()
    _steps(sw, "k", 200, vm_s=2.0, bare_s=1.0)
    assert not sw.is_on("k")
    # A kernel got installed (generation 1): the VM's samples are stale, the next steps re-measure it.
    d = _steps(sw, "k", StepSwitch.MIN_SAMPLES, vm_s=0.4, bare_s=1.0, gen=1)
    assert d == [True] * StepSwitch.MIN_SAMPLES
    assert sw.is_on("k") and sw.flips == 2
    assert sw.keys["k"].every == StepSwitch.PROBE_EVERY


def test_a_vm_step_across_a_generation_change_is_no_measurement():
    sw = StepSwitch()
    _steps(sw, "k", 30, vm_s=1.0, bare_s=1.0)
    n = len(sw.keys["k"].vm)
    while not sw.decide("k", 0):
        pass
    sw.record("k", 5.0, True, 1)  # a kernel was installed during the step
    assert len(sw.keys["k"].vm) == n and 5.0 not in sw.keys["k"].vm


def test_keys_are_independent_and_bounded():
    sw = StepSwitch()
    _steps(sw, "slow", 200, vm_s=3.0, bare_s=1.0)
    _steps(sw, "fast", 200, vm_s=0.3, bare_s=1.0)
    assert not sw.is_on("slow") and sw.is_on("fast")
    old = StepSwitch.MAX_KEYS
    try:
        StepSwitch.MAX_KEYS = 3
        for i in range(5):
            sw.decide(("new", i), 0)
        assert len(sw.keys) == 3 and "slow" not in sw.keys
        assert sum(len(m) for m in sw.by_group.values()) == 3  # the group index forgets them too
    finally:
        StepSwitch.MAX_KEYS = old


def test_the_least_recently_decided_key_is_evicted(monkeypatch):
    """A key decided all along survives keys that came after it and were not seen again."""
    monkeypatch.setattr(StepSwitch, "MAX_KEYS", 4)
    sw = StepSwitch()
    _steps(sw, "hot", 30, vm_s=3.0, bare_s=1.0)
    assert not sw.is_on("hot")
    for i in range(20):
        sw.decide(("once", i), 0)
        sw.decide("hot", 0)
    assert "hot" in sw.keys and not sw.is_on("hot") and len(sw.keys) == 4


def test_votes_read_their_group_only():
    sw = StepSwitch()
    for g in range(3):
        _steps_g(sw, ("a", g), "A", 40, vm_s=3.0, bare_s=1.0)
    for i in range(500):  # many keys of other groups
        sw.decide(("b", i), 0, ("B", i))
    assert sw.votes("A") == [3, 0] and sw.votes("B") == [0, 0] and sw.votes(("B", 7)) == [0, 0]
    assert len(sw.by_group["A"]) == 3


def _steps_g(sw, key, group, n, vm_s, bare_s, gen=0):
    out = []
    for _ in range(n):
        vm = sw.decide(key, gen, group)
        out.append(vm)
        sw.record(key, vm_s if vm else bare_s, vm, gen)
    return out


def test_a_new_size_class_starts_the_way_its_group_agreed_on():
    sw = StepSwitch()
    for cls in (1, 2):
        _steps_g(sw, ("a", cls), "a", 60, vm_s=0.3, bare_s=1.0)
    assert sw.votes("a") == [0, 2]
    d = _steps_g(sw, ("a", 3), "a", 40, vm_s=0.3, bare_s=1.0)
    assert sw.keys[("a", 3)].prior
    # No forced sampling of the slower way: only probes (about 1 in 16) run bare.
    assert sum(not x for x in d) <= 6
    # Another group learns on its own.
    d = _steps_g(sw, ("b", 3), "b", 20, vm_s=0.7, bare_s=1.0)  # (not 2x apart: no early settling)
    assert not sw.keys[("b", 3)].prior and sum(not x for x in d[:14]) >= StepSwitch.MIN_SAMPLES


def test_a_prior_is_overruled_by_the_keys_own_samples():
    sw = StepSwitch()
    for cls in (1, 2):
        _steps_g(sw, ("a", cls), "a", 60, vm_s=2.0, bare_s=1.0)
    assert sw.votes("a") == [2, 0]
    # This size class is faster under the VM (say large enough for its kernels to pay).
    _steps_g(sw, ("a", 9), "a", 400, vm_s=0.3, bare_s=1.0)
    k = sw.keys[("a", 9)]
    assert k.prior and sw.is_on(("a", 9)) and len(k.bare) >= StepSwitch.MIN_SAMPLES
    assert sw.votes("a") == [2, 1]


def test_groups_without_agreement_give_no_prior():
    sw = StepSwitch()
    _steps_g(sw, ("a", 1), "a", 60, vm_s=2.0, bare_s=1.0)
    _steps_g(sw, ("a", 2), "a", 60, vm_s=0.3, bare_s=1.0)
    assert sw.votes("a") == [1, 1]
    sw.decide(("a", 3), 0, "a")
    assert not sw.keys[("a", 3)].prior


def test_probed_vm_steps_are_dropped_unless_they_keep_coming():
    sw = StepSwitch()
    key = "k"
    for _ in range(StepSwitch.LEARN + 1):
        sw.decide(key, 0)
    k = sw.keys[key]
    sw.record(key, 9.0, True, 0, probed=True)
    assert not k.vm  # one probed step: dropped
    sw.record(key, 1.0, True, 0)
    assert list(k.vm) == [1.0] and k.probed == 0
    for _ in range(StepSwitch.MAX_PROBED):
        sw.record(key, 9.0, True, 0, probed=True)
    assert list(k.vm) == [1.0]
    # Probes in every step (many groups): after MAX_PROBED in a row they count, or the key would
    # never be measured under the VM.
    sw.record(key, 9.0, True, 0, probed=True)
    assert list(k.vm) == [1.0, 9.0]
    sw.record(key, 2.0, False, 0, probed=True)  # (bare steps run no tier 1 at all)
    assert list(k.bare) == [2.0]


def test_a_much_slower_way_settles_early():
    sw = StepSwitch()
    d = _steps(sw, "k", 60, vm_s=0.25, bare_s=1.0)
    k = sw.keys["k"]
    assert sw.is_on("k") and len(k.bare) < StepSwitch.MIN_SAMPLES and k.early
    # The first bare sample, 4x slower than the VM's, was enough: later bare steps are probes.
    assert sum(not x for x in d) <= 2 + 60 // 8
    sw2 = StepSwitch()
    d = _steps(sw2, "k", 60, vm_s=3.0, bare_s=1.0)
    k2 = sw2.keys["k"]
    assert not sw2.is_on("k") and len(k2.vm) < StepSwitch.MIN_SAMPLES and k2.early
    assert sum(d[StepSwitch.LEARN:]) <= 2 + 60 // 8


def test_close_ways_do_not_settle_early():
    sw = StepSwitch()
    _steps(sw, "k", 40, vm_s=1.3, bare_s=1.0)
    k = sw.keys["k"]
    assert not k.early and not sw.is_on("k")
    assert len(k.vm) >= StepSwitch.MIN_SAMPLES and len(k.bare) >= StepSwitch.MIN_SAMPLES
