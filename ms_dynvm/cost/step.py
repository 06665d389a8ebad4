"""Step switch: run each step of a script under the VM or bare, by measured time, per size class.

ms_dynvm pays for itself only where its kernels save more than its handler, recorder and run
tracking cost; on small models with little to fuse it makes a step slower than MindSpore alone.
So it measures whole steps both ways and runs each size class the faster way.

Steps. The frontend (`frontend/dispatch.py`, `StepGate`) sees every *region start*: an outermost
`nn.Cell` call or a backward pass (`_PyNativeExecutor.grad`) outside any Cell call. One region
owner (a Cell, a differentiated function) is the *anchor*: the first one seen, replaced by another
one when the anchor has not started for `ANCHOR_PATIENCE` region starts. A step is the time from one
start of the anchor to its next start: in a training loop, the whole iteration (forward, loss,
backward, optimizer, the script's own code); in an inference loop, one call and what follows it.
Its key is the anchor and a size class of the anchor call's tensor arguments (per argument, the bit
length of its element count: roughly per batch size and sequence length, a bounded number of
classes; past 4 tensor arguments, their number and the class of their total: `dispatch._size_classes`;
at most MAX_KEYS keys, the least recently decided evicted first). A script with no region (no Cell call, no backward pass) has sync-anchored steps until a
region starts: from the first op after a sync point outside any region to the first such sync
point `dispatch.MIN_SYNC_STEP_S` later, keyed by that op's name and its arguments' size classes and
timed per sync point (`StepGate.sync_point`, `StepGate.first_op`). This class sees keys and times
only: the two kinds of steps differ in the frontend alone.

Two ways to run a step:
- under the VM: ms_dynvm's dispatch mode sees every op: it records, tracks runs, compiles, serves;
- bare: the dispatch mode is off MindSpore's mode stack until the next anchor start, and MindSpore
  runs the step alone, at plain eager speed (nothing recorded, counted or fused).

Policy, per key (the numbers are class attributes):
- the first `LEARN` steps run under the VM and are not measured (the recorder makes its plans, tier 1
  counts its runs and may start compiles: not the steady state);
- then each step picks a way at random (a seeded generator: a script that calls the anchor twice per
  iteration must not measure one way always on the first call and the other on the second) until
  each way has `MIN_SAMPLES` measurements;
- a key settles early when one way has its samples and the other's first samples are already
  `EARLY_RATIO` (2x) slower: the slow way is then measured by the probes alone (a 4x-faster VM
  would otherwise pay three 4x-slower bare steps per size class);
- then the key runs the way whose median over its last `WINDOW` measurements is lower, switching
  only past `HYSTERESIS` (5%); the other way is re-measured in one step in `PROBE_EVERY` (at random),
  half as often after each probe that confirms the choice (down to one in `MAX_PROBE_EVERY`: a
  probe of the slower way costs its difference), back to `PROBE_EVERY` when the choice changes;
- a new key whose group (the other size classes of its anchor) has `PRIOR_KEYS` or more settled
  keys, all of which chose one way, starts that way, without the random sampling: the other way is
  measured by the probes alone until the key has its own samples of both (a run with many size
  classes would otherwise pay the slower way's sampling steps in each);
- when tier 1 installs a kernel (its `generation` changes), the VM measurements of every key are
  stale (they were taken without it): they are dropped, and the key runs under the VM until it has
  `MIN_SAMPLES` new ones. A VM step during which a kernel was installed is no measurement either;
  nor is one in which tier 1 ran a group eagerly to measure it (its own size switch's probe), up to
  `MAX_PROBED` such steps in a row.

While a key runs bare, its groups are neither counted nor compiled except in probe steps, so a
workload whose groups would pay only after very many calls may stay bare. That is the chosen trade:
under `enable()` a script should not run slower than without it where ms_dynvm can measure that.
"""

from __future__ import annotations

import random
import statistics
import weakref
from collections import deque

from ms_dynvm.observe import series as _series


class _Key:
    __slots__ = ("n", "vm", "bare", "on", "gen", "every", "group", "prior", "probed", "early")

    def __init__(self, window: int, gen: int, group) -> None:
        self.n = 0
        self.vm: deque = deque(maxlen=window)
        self.bare: deque = deque(maxlen=window)
        self.on = True  # the way chosen once both have samples: VM (True) or bare
        self.gen = gen
        self.every = StepSwitch.PROBE_EVERY  # the other way is probed in one step in this many
        self.group = group  # keys of one group (one anchor) share a prior (see StepSwitch)
        self.prior = False  # started from its group's agreed way: no forced sampling
        self.probed = 0  # VM steps dropped in a row because tier 1 probed in them (`record`)
        self.early = False  # settled before both ways had MIN_SAMPLES samples (EARLY_RATIO)


class StepSwitch:
    """Per step key: under the VM or bare (see the module docstring)."""

    LEARN = 2
    MIN_SAMPLES = 3
    WINDOW = 7
    PROBE_EVERY = 16
    MAX_PROBE_EVERY = 256
    HYSTERESIS = 0.05
    MAX_KEYS = 4096
    ANCHOR_PATIENCE = 64
    PRIOR_KEYS = 2
    MAX_PROBED = 6
    EARLY_RATIO = 2.0

    def __init__(self, seed: int = 0x5EED) -> None:
        _SWITCHES.add(self)
        self.keys: dict = {}  # key -> _Key, least recently decided first (MAX_KEYS evicts from there)
        self.by_group: dict = {}  # group -> {key: _Key}: `votes` reads one group, not every key
        self.flips = 0  # VM -> bare and bare -> VM decisions of a key
        self._rng = random.Random(seed)

    def _settled(self, k: _Key) -> bool:
        return k.early or (len(k.vm) >= self.MIN_SAMPLES and len(k.bare) >= self.MIN_SAMPLES)

    def votes(self, group) -> list:
        """[settled keys of `group` that chose bare, ... that chose the VM]."""
        v = [0, 0]
        for k in self.by_group.get(group, {}).values():
            if self._settled(k):
                v[k.on] += 1
        return v

    def _get(self, key, generation: int, group=None) -> _Key:
        keys = self.keys
        k = keys.pop(key, None)
        if k is not None:
            keys[key] = k  # (most recently decided last)
            if k.gen != generation:
                k.vm.clear()
                k.gen = generation
                k.every = self.PROBE_EVERY
            return k
        if len(keys) >= self.MAX_KEYS:  # the least recently decided key goes
            old_key = next(iter(keys))
            old = keys.pop(old_key)
            members = self.by_group.get(old.group)
            if members is not None:
                members.pop(old_key, None)
                if not members:
                    del self.by_group[old.group]
        v = self.votes(group)
        k = keys[key] = _Key(self.WINDOW, generation, group)
        self.by_group.setdefault(group, {})[key] = k
        if min(v) == 0 and max(v) >= self.PRIOR_KEYS:
            # Every settled key of this group chose one way: a new size class starts that way
            # and is measured the other way only by probes.
            k.on = v[1] > 0
            k.prior = True
        return k

    def decide(self, key, generation: int, group=None) -> bool:
        """True: run this step of `key` under the VM; False: bare. `generation`: tier 1's count of
        installed kernels; `group`: keys that share a prior (the anchor's size classes)."""
        k = self._get(key, generation, group)
        k.n += 1
        if k.n <= self.LEARN:
            return True
        need_vm = len(k.vm) < self.MIN_SAMPLES
        need_bare = len(k.bare) < self.MIN_SAMPLES
        if (k.prior or k.early) and (need_vm or need_bare):
            return k.on != (self._rng.random() < 1.0 / k.every)
        if (need_vm or need_bare) and k.vm and k.bare:
            # One way already EARLY_RATIO times slower: sample only the other (see `record`).
            v, b = statistics.median(k.vm), statistics.median(k.bare)
            if b > self.EARLY_RATIO * v and need_vm:
                return True
            if v > self.EARLY_RATIO * b and need_bare:
                return False
        if need_vm and need_bare:
            return self._rng.random() < 0.5
        if need_vm or need_bare:
            return need_vm
        return k.on != (self._rng.random() < 1.0 / k.every)

    def record(self, key, seconds: float, vm: bool, generation: int, probed: bool = False) -> None:
        """A step of `key` run as `decide` said took `seconds` (wall). The first `LEARN` steps and a
        VM step across a generation change are not measurements; nor is a VM step in which tier 1
        ran a group eagerly to measure it (`probed`: its own size switch's probe, not what the
        script will see), unless `MAX_PROBED` such steps came in a row (a step with many groups
        nearly always holds a probe early on: the key would never get its VM samples)."""
        _series.step_end(key, seconds, vm)
        k = self.keys.get(key)
        if k is None or k.n <= self.LEARN:
            return
        if vm:
            if generation != k.gen:
                return
            if probed:
                k.probed += 1
                if k.probed <= self.MAX_PROBED:
                    return
            else:
                k.probed = 0
            k.vm.append(seconds)
        else:
            k.bare.append(seconds)
        if not k.early and (k.vm and k.bare) and (len(k.vm) >= self.MIN_SAMPLES) != (len(k.bare) >= self.MIN_SAMPLES):
            # One way has its samples and the other's first ones are already EARLY_RATIO times
            # slower: settled without more steps of the slow way (probes still measure it, and the
            # full comparison below takes over once both have their samples).
            v, b = statistics.median(k.vm), statistics.median(k.bare)
            if len(k.vm) >= self.MIN_SAMPLES and b > self.EARLY_RATIO * v:
                k.on, k.early = True, True
            elif len(k.bare) >= self.MIN_SAMPLES and v > self.EARLY_RATIO * b:
                k.on, k.early = False, True
                self.flips += 1
        if len(k.vm) >= self.MIN_SAMPLES and len(k.bare) >= self.MIN_SAMPLES:
            v, b = statistics.median(k.vm), statistics.median(k.bare)
            if k.on and v > b * (1 + self.HYSTERESIS):
                k.on = False
                self.flips += 1
                k.every = self.PROBE_EVERY
            elif not k.on and v < b * (1 - self.HYSTERESIS):
                k.on = True
                self.flips += 1
                k.every = self.PROBE_EVERY
            elif vm != k.on:
                # A probe that confirmed the choice: probe half as often (down to one step in
                # MAX_PROBE_EVERY), so that a settled key pays little for re-measuring.
                k.every = min(2 * k.every, self.MAX_PROBE_EVERY)

    def is_on(self, key) -> bool:
        k = self.keys.get(key)
        return k is None or k.on

    def bare_keys(self) -> int:
        return sum(not k.on for k in self.keys.values())

    def summary(self) -> list:
        """Per key: the key, steps decided, the chosen way ("vm" or "bare"), and the recent step
        times (seconds) of each way: what `ms_dynvm.report()` shows beside its own step series."""
        return [{"key": key, "steps": k.n, "way": "vm" if k.on else "bare", "vm": list(k.vm),
                 "bare": list(k.bare)} for key, k in list(self.keys.items())]


_SWITCHES: weakref.WeakSet = weakref.WeakSet()


def switches() -> list:
    """The live StepSwitch objects (one per tier-1 executor)."""
    return list(_SWITCHES)
