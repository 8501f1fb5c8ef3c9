"""The warp-specialized kernels' barrier protocols (cuda/sm90/bwd/ and cuda/sm90/fwd/), through
their model in scripts/ws_protocol_model.py: no interleaving of the roles deadlocks or leaves a
barrier generation half complete (backward: unit sequences with and without steps, one or two dS^T
buffers, one or two dQ buffers or dQ in the Q/dO stage, two dQ writer warps taking turns; forward:
0-12 KV tiles, ping-pong turns, every combination of skipped steps, persistent tile sequences, with
the turns running on across tiles or not); and the model does catch the mistakes the kernels'
comments warn about (a dQEmpty hand-over after a unit's last step, an empty-barrier wait on the
wrong parity, a missing or an extra ping-pong hand-over (and, with the turns chained, an opening
arrive per tile or no closing sync), skipped steps without their turns, without their waits, or
releasing a stage a turn early, a first computing turn without its V wait, a dQ buffer freed before
its partial was read, the math waiting on the wrong writer's dQ-empty barrier or both math
warpgroups on one warpgroup's dQ barriers, a writer reducing a warpgroup's half before it was
stored). The model mirrors the kernel by hand; the GPU run (scripts/device_round.sh, stage checks)
is what checks the kernel itself."""

import importlib.util
import itertools
import pathlib
import random

import pytest

_PATH = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "ws_protocol_model.py"


@pytest.fixture(scope="module")
def model():
    spec = importlib.util.spec_from_file_location("ws_protocol_model", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _unit_sequences(seed, count):
    rng = random.Random(seed)
    return rng, [[rng.choice((0, 0, 1, 2, 3, 5)) for _ in range(rng.randint(0, 6))]
                 for _ in range(count)]


class _Starving(random.Random):
    """An interleaving that runs one actor (``slow``) only 1 time in 10 when another can run: the
    uniform choice rarely lets the others run far ahead of one role, which is where a barrier
    generation can be joined twice by the same actor."""

    def __init__(self, seed, slow):
        super().__init__(seed)
        self.slow = slow

    def choice(self, seq):
        if (isinstance(seq, list) and len(seq) > 1 and self.slow in seq
                and all(isinstance(x, str) for x in seq) and self.random() < 0.9):
            seq = [x for x in seq if x != self.slow]
        return super().choice(seq)


_DQ = {"one buffer": (False, 1, 2), "two buffers": (False, 2, 2), "in stage": (True, 1, 2),
       "one buffer, one writer": (False, 1, 1), "in stage, one writer": (True, 1, 1)}
# (dQ hand-off, starved role): hd128 / hd64 / hd256 with two writers, the masked kernels with one.
_DQ_SLOW = [(dq, slow) for dq, (_, _, writers) in _DQ.items()
            for slow in [None, "P", "W0", "W1", "M0", "M1"][:6 if writers == 2 else 3] +
            ([] if writers == 2 else ["M0", "M1"])]


@pytest.mark.parametrize("dq, slow", _DQ_SLOW)
@pytest.mark.parametrize("q_stages", [1, 2])  # 2: the kernels; 1: the first hd256 kernel
@pytest.mark.parametrize("ds_stages", [1, 2])
def test_protocol_never_deadlocks(model, ds_stages, q_stages, dq, slow):
    dq_in_stage, dq_buffers, writers = _DQ[dq]
    rng, sequences = _unit_sequences(ds_stages, 800 if slow is None else 150)
    if slow is not None:
        rng = _Starving(ds_stages, slow)
    for units in sequences:
        model.run(units, rng, ds_stages, q_stages, dq_in_stage, dq_buffers, writers)


@pytest.mark.parametrize("slow", [None, "P", "W0", "W1", "M0", "M1"])
@pytest.mark.parametrize("dq_buffers, ds_stages", [(1, 2), (2, 1)])  # head_dim 128, 64
def test_protocol_with_s_a_step_ahead_never_deadlocks(model, dq_buffers, ds_stages, slow):
    """The unmasked kernels' kNextS: the math waits for the next step's Q/dO stage before it
    hands this step's dQ over and frees this step's stage."""
    rng, sequences = _unit_sequences(7 + dq_buffers, 800 if slow is None else 150)
    if slow is not None:
        rng = _Starving(7 + dq_buffers, slow)
    for units in sequences:
        model.run(units, rng, ds_stages, 2, False, dq_buffers, 2, next_s=True)


_KV_FIRST = {"hd128": (2, False, 1, True), "hd64": (1, False, 2, True),
             "hd256": (2, True, 1, False)}  # (dS^T buffers, dQ in stage, dQ buffers, next_s)


@pytest.mark.parametrize("slow", [None, "P", "W0", "W1", "M0", "M1"])
@pytest.mark.parametrize("kernel", sorted(_KV_FIRST))
def test_protocol_with_kv_before_the_tables_never_deadlocks(model, kernel, slow):
    """The unmasked kernels (UnitScheduler::kKVFirst): the producer loads K and V and the unit's
    first Q/dO stage once the first math thread has handed it the fetched unit (an mbarrier),
    before the unit barrier (K and V whatever the step count), and the math waits for K and V in
    every unit (a stepless one before its epilogue); no load lands while the math still uses the
    previous unit's tiles."""
    ds_stages, dq_in_stage, dq_buffers, next_s = _KV_FIRST[kernel]
    rng, sequences = _unit_sequences(13 + dq_buffers, 600 if slow is None else 150)
    if slow is not None:
        rng = _Starving(13 + dq_buffers, slow)
    for units in sequences:
        model.run(units, rng, ds_stages, 2, dq_in_stage, dq_buffers, 2, next_s, kv_first=True)


def _kv_mistake(model, role, mistake):
    """The K/V hand-over with one mistake (kv_first): ``"early_load"``, the producer loads the next
    unit's K and V before the fetched unit is handed over (while the math may still run the previous unit's
    epilogue); ``"no_wait"``, the math waits for K and V only in units with steps (as the masked
    kernels, whose producer skips those loads), not before a stepless unit's epilogue;
    ``"late_read"``, the math's dK/dV stores are waited
    for after the unit barrier, not before it."""
    correct = getattr(model, role)

    def producer(units, q_stages=2, kv_first=False):
        ops = list(correct(units, q_stages, kv_first))
        loads = [i for i, op in enumerate(ops) if op[0] == "kv_load"]
        for i in reversed(loads[1:]):  # each load but the first one before its hand-over wait
            ops.insert(i - 1, ops.pop(i))
        yield from ops

    def math(units, ds_stages, q_stages=2, dq_in_stage=False, dq_buffers=1, writers=2, g=0,
             next_s=False, kv_first=False):
        ops = correct(units, ds_stages, q_stages, dq_in_stage, dq_buffers, writers, g, next_s,
                      kv_first)
        unit = 0
        late_end = skip_begin = False
        waited = 0  # the kv_full waits made: their parity, as the code would count them
        for op in ops:
            if op == ("sync", model.UNIT):
                unit += 1  # [B] and [C] of each unit: unit // 2 is the unit's index
            if op[0] == "kv_end" and mistake == "late_read":
                late_end = True  # after the unit barrier that comes next
                continue
            if late_end and op == ("sync", model.UNIT):
                yield op
                yield ("kv_end",)
                late_end = False
                continue
            if op[0] == "mb_wait" and op[1] == "kv_full":
                if mistake == "no_wait" and units[(unit - 1) // 2] == 0:
                    skip_begin = True
                    continue
                op = ("mb_wait", "kv_full", waited & 1)
                waited += 1
            if skip_begin and op[0] == "kv_begin":
                skip_begin = False
                continue
            yield op

    return producer if role == "producer" else math


@pytest.mark.parametrize("role, mistake", [("producer", "early_load"), ("math", "no_wait"),
                                           ("math", "late_read")])
def test_model_catches_kv_hand_over_mistakes(model, monkeypatch, role, mistake):
    monkeypatch.setattr(model, role, _kv_mistake(model, role, mistake))
    rng, sequences = _unit_sequences(17, 300)
    caught = 0
    for units in sequences:
        try:
            model.run(units, rng, 2, 2, False, 1, 2, True, kv_first=True)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 20, caught


def test_model_catches_s_a_step_ahead_with_one_stage(model):
    """With one Q/dO stage the next step's Q can only be loaded once this step frees the stage,
    which kNextS does after waiting for that Q: every unit of two or more steps deadlocks (the
    kernels assert two stages)."""
    rng = random.Random(5)
    with pytest.raises(model.Deadlock):
        model.run([2], rng, 2, 1, False, 1, 2, next_s=True)


def test_model_catches_one_dq_full_barrier_for_both_stages(model, monkeypatch):
    """With the dQ partial in the Q/dO stage and no dQ-empty barrier, the math can store step s+1
    before the writer has taken step s: one dQ-full barrier for both stages (both writers) would
    then see the math arrive twice in one generation. The model must catch that (the kernel has
    one per stage, its writer's)."""
    monkeypatch.setattr(model, "DQ_FULL_OF", (model.DQ_FULL, model.DQ_FULL))
    _, sequences = _unit_sequences(11, 300)
    rng = _Starving(11, "W0")
    caught = 0
    for units in sequences:
        try:
            model.run(units, rng, 2, 2, True)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 50


def _broken_writer(model, mistake):
    """A writer with one mistake: ``"last"`` frees its buffer after every step it read, its
    unit's last one included; ``"early"`` frees a half before the bulk reduction has read it;
    ``"one_half"`` waits for warpgroup 0's half only and reduces both (the hand-off of the whole
    tile on one warpgroup's barrier)."""
    def writer(units, w, q_stages=2, dq_in_stage=False, dq_buffers=1, writers=2):
        for unit, steps in enumerate(units + [None]):
            yield ("sync", model.UNIT)
            if steps is None:
                return
            for j in range(min(dq_buffers, steps)):
                if (j + dq_buffers) % model.WRITERS == w:
                    for g in (0, 1):
                        yield ("arrive", model.dq_empty(w, g))
            for s in range(w, steps, model.WRITERS):
                for g in (0, 1):
                    if mistake != "one_half" or g == 0:
                        yield ("sync", model.dq_full(w, g))
                    read = ("dq_read", (unit, s), s % dq_buffers, g)
                    free = ("arrive", model.dq_empty(w, g))
                    frees = mistake == "last" or s + dq_buffers < steps
                    if mistake == "early" and frees:
                        yield free
                    yield read
                    if mistake != "early" and frees:
                        yield free
            yield ("sync", model.UNIT)
    return writer


def _writer_releasing_after_the_last_step(model):
    return _broken_writer(model, "last")


def _writer_freeing_before_the_read(model):
    return _broken_writer(model, "early")


def _writer_taking_one_half(model):
    return _broken_writer(model, "one_half")


def _math_on_writer_0s_empty_barrier(model):
    """The math waits on writer 0's dQ-empty barrier before every store (one writer's protocol)."""
    correct = model.math

    def math(units, ds_stages, q_stages=2, dq_in_stage=False, dq_buffers=1, writers=2, g=0,
             next_s=False, kv_first=False):
        for op in correct(units, ds_stages, q_stages, dq_in_stage, dq_buffers, writers, g,
                          next_s, kv_first):
            if op[0] == "sync" and isinstance(op[1], tuple) and op[1][0] in model.DQ_EMPTY_OF:
                op = ("sync", model.dq_empty(0, g))
            yield op
    return math


def _math_on_warpgroup_0s_dq_barriers(model):
    """Both math warpgroups hand their halves over on warpgroup 0's dQ barriers (the barriers of
    the hand-off of the whole tile, with the per-warpgroup thread counts)."""
    correct = model.math

    def math(units, ds_stages, q_stages=2, dq_in_stage=False, dq_buffers=1, writers=2, g=0,
             next_s=False, kv_first=False):
        for op in correct(units, ds_stages, q_stages, dq_in_stage, dq_buffers, writers, g,
                          next_s, kv_first):
            if op[0] in ("sync", "arrive") and isinstance(op[1], tuple):
                op = (op[0], (op[1][0], 0))
            yield op
    return math


def _producer_on_the_wrong_parity(model):
    def producer(units, q_stages=2, kv_first=False):
        q_iter = 0
        for unit, steps in enumerate(units + [None]):
            yield ("sync", model.UNIT)
            if steps is None:
                return
            if steps > 0:
                yield ("kv_load", unit)
            for _ in range(steps):
                stage, phase = q_iter % q_stages, (q_iter // q_stages) & 1
                yield ("mb_wait", f"q_empty{stage}", phase)
                yield ("mb_arrive", f"q_full{stage}")
                q_iter += 1
            yield ("sync", model.UNIT)
    return producer


@pytest.mark.parametrize("role, broken, dq_buffers", [
    ("writer", _writer_releasing_after_the_last_step, 1),
    ("writer", _writer_freeing_before_the_read, 1),
    ("writer", _writer_freeing_before_the_read, 2),
    ("math", _math_on_writer_0s_empty_barrier, 1),
    ("math", _math_on_writer_0s_empty_barrier, 2),
    ("math", _math_on_warpgroup_0s_dq_barriers, 1),
    ("writer", _writer_taking_one_half, 1),
    ("writer", _writer_taking_one_half, 2),
    ("producer", _producer_on_the_wrong_parity, 1)])
def test_model_catches_protocol_mistakes(model, monkeypatch, role, broken, dq_buffers):
    monkeypatch.setattr(model, role, broken(model))
    rng, sequences = _unit_sequences(7, 200)
    if broken is _writer_freeing_before_the_read:
        rng = _Starving(7, "W0")  # the read comes late: the math's next store gets there first
    caught = 0
    for units in sequences:
        try:
            model.run(units, rng, 2, 2, False, dq_buffers)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 20, caught


@pytest.mark.parametrize("warpgroups", [2, 3])
def test_forward_protocol_never_deadlocks(model, warpgroups):
    rng = random.Random(3)
    for n_end in list(range(0, 13)) * 40:
        model.run_forward(n_end, rng, warpgroups)


@pytest.mark.parametrize("slow", [None, "TMA"])
@pytest.mark.parametrize("warpgroups", [2, 3])
def test_forward_every_skip_combination(model, warpgroups, slow):
    """Every combination of skipped steps (fwd_kernel's `first` per warpgroup, 0..n_end each),
    tiles in which no warpgroup computes every step included (the kernel makes none, but the
    protocol does not rely on that), 0-6 KV steps, a few interleavings each, loads landing late
    too."""
    rng = random.Random(11) if slow is None else _Starving(11, slow)
    for n_end in range(0, 7):
        for firsts in itertools.product(range(n_end + 1), repeat=warpgroups):
            for _ in range(3 if slow is None else 6):
                model.run_forward(n_end, rng, warpgroups, firsts)


def _first_turn_without_v_wait(original, model):
    """The first computing turn of a skipping warpgroup releasing V_{first-1}'s stage without
    waiting for that load (the tenth session's kernel)."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        first = _first(tiles, wg)
        for turns, op in _by_turn(original(tiles, wg, warpgroups, persistent, chain), wg, model):
            if (0 < first and turns == first + 1 and op[0] == "mb_wait"
                    and op[1].startswith("bar_v")):
                continue
            yield op
    return forward_math


def test_forward_first_computing_turn_needs_its_v_wait(model, monkeypatch):
    """Why a skipping warpgroup's first computing turn waits for V_{first-1}: without the wait,
    when every warpgroup skips the first steps, the producer can issue V_{first+1} into the stage
    while V_{first-1} is still in flight (the model sees it once loads land late). With the wait
    the same tile passes (test above)."""
    monkeypatch.setattr(model, "forward_math", _first_turn_without_v_wait(model.forward_math, model))
    caught = 0
    for seed in range(400):
        try:
            model.run_forward(4, _Starving(seed, "TMA"), 2, (2, 2))
        except AssertionError as e:
            assert "is issued while" in str(e)
            caught += 1
    assert caught > 0


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("slow", [None, "P", "M0", "M1", "M2", "TMA"])
@pytest.mark.parametrize("warpgroups", [2, 3])
def test_persistent_forward_tile_sequences(model, warpgroups, slow, chain):
    """The persistent kernel: 1-4 tiles a CTA, each with its own step count and skipped steps, the
    stage ring and Q's barrier running on across them; with chain (head_dim 64) the turns too."""
    if slow == "M2" and warpgroups == 2:
        pytest.skip("no third warpgroup")
    rng = random.Random(17) if slow is None else _Starving(17, slow)
    for _ in range(800 if slow is None else 200):
        model.run_forward_tiles(model.random_forward_tiles(rng, warpgroups), rng, warpgroups,
                                chain=chain)


def _first_tile(tiles):
    return tiles[0][0] if tiles else 0


def _math_without_the_first_hand_over(original, model):
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        ops = original(tiles, wg, warpgroups, persistent, chain)
        if wg == warpgroups - 1 and _first_tile(tiles) > 0:
            next(ops)  # drop the initial arrive that lets the first warpgroup go first
        return ops
    return forward_math


def _math_handing_over_after_the_last_turn(original, model):
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        yield from original(tiles, wg, warpgroups, persistent, chain)
        if wg == warpgroups - 1 and _first_tile(tiles) > 0:  # the hand-over the kernel skips
            yield ("arrive", model.TURN[0])
    return forward_math


def _math_handing_over_to_the_wrong_warpgroup(original, model):
    # two warpgroups' ping-pong rule (hand to wg ^ 1) kept with three
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        for op in original(tiles, wg, warpgroups, persistent, chain):
            if op[0] == "arrive" and wg == 0:
                op = ("arrive", model.TURN[warpgroups - 1])
            yield op
    return forward_math


# (with two warpgroups wg ^ 1 is the next one, so the third mistake exists only with three)
@pytest.mark.parametrize("broken, warpgroups", [
    (_math_without_the_first_hand_over, 2), (_math_without_the_first_hand_over, 3),
    (_math_handing_over_after_the_last_turn, 2), (_math_handing_over_after_the_last_turn, 3),
    (_math_handing_over_to_the_wrong_warpgroup, 3)])
def test_forward_model_catches_protocol_mistakes(model, monkeypatch, broken, warpgroups):
    monkeypatch.setattr(model, "forward_math", broken(model.forward_math, model))
    rng = random.Random(5)
    caught = 0
    for n_end in range(1, 9):
        try:
            model.run_forward(n_end, rng, warpgroups)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught == 8


def _persistent_opening_every_tile(original, model):
    """The persistent kernel's turns running on from tile to tile, but the last warpgroup's
    opening arrive still made for a second tile with steps (as when each tile started afresh);
    made up front here: wherever it lands, the first warpgroup's turns see one arrive too many."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        ops = list(original(tiles, wg, warpgroups, persistent, chain))
        if wg == warpgroups - 1 and sum(n_end > 0 for n_end, _ in tiles) > 1:
            ops = [("arrive", model.TURN[0])] + ops
        return iter(ops)
    return forward_math


def _persistent_without_the_closing_sync(original, model):
    """The first warpgroup not taking the last warpgroup's hand-over after its last tile."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        ops = list(original(tiles, wg, warpgroups, persistent, chain))
        if wg == 0 and ops and ops[-1] == ("sync", model.TURN[0]):
            ops = ops[:-1]
        return iter(ops)
    return forward_math


@pytest.mark.parametrize("broken", [_persistent_opening_every_tile,
                                    _persistent_without_the_closing_sync])
@pytest.mark.parametrize("warpgroups", [2, 3])
def test_persistent_forward_model_catches_turn_chain_mistakes(model, monkeypatch, broken,
                                                              warpgroups):
    """With the turns running on across tiles (chain: one opening arrive per CTA, the last
    hand-over of each tile made, the first warpgroup taking the last one after its last tile),
    an opening arrive per tile, or no closing sync, is caught on two tiles with steps."""
    monkeypatch.setattr(model, "forward_math", broken(model.forward_math, model))
    caught = 0
    for n_end in range(1, 7):
        try:
            model.run_forward_tiles([(n_end, (0,) * warpgroups), (3, (0,) * warpgroups)],
                                    random.Random(n_end), warpgroups, chain=True)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught == 6


def _first(tiles, wg):
    """The first step warpgroup wg computes in the first tile (0 without tiles)."""
    return tiles[0][1][wg] if tiles else 0


def _by_turn(ops, wg, model):
    """(turns the warpgroup has begun so far, op) for each of its ops."""
    turns = 0
    for op in ops:
        if op == ("sync", model.TURN[wg]):
            turns += 1
        yield turns, op


def _skipping_without_turns(original, model):
    """A warpgroup that skips steps by leaving out their turns altogether."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        ops = original(tiles, wg, warpgroups, persistent, chain)
        first = _first(tiles, wg)
        dropped = 0
        for op in ops:
            if dropped < first and op == ("sync", model.TURN[wg]):
                # drop this turn: its sync and everything up to its hand-over
                for inner in ops:
                    if inner[0] == "arrive" and inner[1] in model.TURN:
                        break
                dropped += 1
                continue
            yield op
    return forward_math


def _skipping_without_waits(original, model):
    """Skipped turns that release their stages without waiting for them to be loaded."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        first = _first(tiles, wg)
        for turns, op in _by_turn(original(tiles, wg, warpgroups, persistent, chain), wg, model):
            if turns <= first and op[0] == "mb_wait" and op[1] != "bar_q":
                continue
            yield op
    return forward_math


def _skipping_releasing_the_turns_own_v(original, model):
    """A skipped turn t that releases V_t (not V_{t-1}, as the computing turns do)."""
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        first = _first(tiles, wg)
        for turns, op in _by_turn(original(tiles, wg, warpgroups, persistent, chain), wg, model):
            if op == ("sync", model.TURN[wg]) and turns <= first:
                yield op
                yield ("mb_arrive", *model._stage("v_empty", turns - 1))
                continue
            if (op[0] == "mb_arrive" and op[1].startswith("v_empty") and turns <= first + 1):
                continue  # released above, a turn early
            yield op
    return forward_math


@pytest.mark.parametrize("broken", [_skipping_without_turns, _skipping_without_waits,
                                    _skipping_releasing_the_turns_own_v])
def test_forward_model_catches_skipping_mistakes(model, monkeypatch, broken):
    monkeypatch.setattr(model, "forward_math", broken(model.forward_math, model))
    caught = 0
    cases = [(n_end, firsts) for n_end in range(3, 7)
             for firsts in itertools.product(range(n_end + 1), repeat=2) if max(firsts) > 1]
    for n_end, firsts in cases:
        try:
            for seed in range(20):
                model.run_forward_tiles([(n_end, firsts), (n_end, firsts)], random.Random(seed),
                                        2)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > len(cases) // 4, (caught, len(cases))
    if broken is not _skipping_without_waits:
        # ... and a tile the kernel makes (warpgroup 1 computes every step) among them. Skipped
        # turns without their waits break only tiles in which no warpgroup computes every step.
        with pytest.raises((model.Deadlock, AssertionError)):
            for seed in range(20):
                model.run_forward_tiles([(6, (4, 0)), (6, (4, 0))], random.Random(seed), 2)


# The persistent forward's tile hand-over (fwd/scheduler.cuh): the producer's thread writes each
# fetched slot into a two-entry ring in shared memory, the math warpgroups read it.

def _producer_without_empty_waits(original, model):
    def forward_producer(tiles, persistent=False):
        for op in original(tiles, persistent):
            if op[0] == "mb_wait" and op[1].startswith("slot_empty"):
                continue
            yield op
    return forward_producer


def _math_reading_before_the_full_wait(original, model):
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        held = None
        for op in original(tiles, wg, warpgroups, persistent, chain):
            if op[0] == "mb_wait" and op[1].startswith("slot_full"):
                held = op
                continue
            yield op
            if op[0] == "slot_load" and held is not None:
                yield held
                held = None
    return forward_math


def _math_without_empty_arrivals(original, model):
    def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
        for op in original(tiles, wg, warpgroups, persistent, chain):
            if op[0] == "mb_arrive" and op[1].startswith("slot_empty"):
                continue
            yield op
    return forward_math


@pytest.mark.parametrize("role, broken", [("forward_producer", _producer_without_empty_waits),
                                          ("forward_math", _math_reading_before_the_full_wait),
                                          ("forward_math", _math_without_empty_arrivals)])
@pytest.mark.parametrize("warpgroups", [2, 3])
def test_persistent_forward_model_catches_hand_over_mistakes(model, monkeypatch, role, broken,
                                                             warpgroups):
    """A producer that overwrites a ring entry before every math warpgroup has read it, a math
    warpgroup that reads an entry before its full barrier, or one that never frees it, is caught
    on some of a few tile sequences (tiles without steps let the producer run ahead)."""
    monkeypatch.setattr(model, role, broken(getattr(model, role), model))
    caught = 0
    for seed in range(20):
        rng = random.Random(seed)
        tiles = [(rng.choice((0, 0, 1, 2)), (0,) * warpgroups) for _ in range(rng.randint(3, 6))]
        try:
            model.run_forward_tiles(tiles, rng, warpgroups)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 0
