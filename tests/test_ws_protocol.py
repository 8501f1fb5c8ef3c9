"""The warp-specialized kernels' barrier protocols (cuda/sm90/bwd_main_ws.cuh; fwd_sm90.cu, kWs),
through their model in scripts/ws_protocol_model.py: no interleaving of the roles deadlocks or
leaves a barrier generation half complete (backward: unit sequences with and without steps, one or
two dS^T buffers; forward: 0-12 KV tiles, ping-pong turns); and the model does catch the mistakes
the kernels' comments warn about (a dQEmpty hand-over after a unit's last step, an empty-barrier
wait on the wrong parity, a missing or an extra ping-pong hand-over). The model mirrors the kernel
by hand; the GPU run (scripts/device_ws.sh) is what checks the kernel itself."""

import importlib.util
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


@pytest.mark.parametrize("slow", [None, "P", "W", "M0", "M1"])
@pytest.mark.parametrize("dq_in_stage", [False, True])  # True: head_dim 256 (kdQInStage)
@pytest.mark.parametrize("q_stages", [1, 2])  # 2: the kernels; 1: the first hd256 kernel
@pytest.mark.parametrize("ds_stages", [1, 2])
def test_protocol_never_deadlocks(model, ds_stages, q_stages, dq_in_stage, slow):
    rng, sequences = _unit_sequences(ds_stages, 1500 if slow is None else 300)
    if slow is not None:
        rng = _Starving(ds_stages, slow)
    for units in sequences:
        model.run(units, rng, ds_stages, q_stages, dq_in_stage)


def test_model_catches_one_dq_full_barrier_for_both_stages(model, monkeypatch):
    """With the dQ partial in the Q/dO stage and no dQ-empty barrier, the math can store step s+1
    before the writer has taken step s: one dQ-full barrier for both stages would then see the
    math arrive twice in one generation. The model must catch that (the kernel has one per
    stage)."""
    monkeypatch.setattr(model, "DQ_FULL_OF_STAGE", (model.DQ_FULL, model.DQ_FULL))
    _, sequences = _unit_sequences(11, 300)
    rng = _Starving(11, "W")
    caught = 0
    for units in sequences:
        try:
            model.run(units, rng, 2, 2, True)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 50


def _writer_releasing_after_the_last_step(model):
    def writer(units, q_stages=2, dq_in_stage=False):
        for steps in units + [None]:
            yield ("sync", model.UNIT)
            if steps is None:
                return
            if steps > 0:
                yield ("arrive", model.DQ_EMPTY)
            for _ in range(steps):
                yield ("sync", model.DQ_FULL)
                yield ("arrive", model.DQ_EMPTY)
            yield ("sync", model.UNIT)
    return writer


def _producer_on_the_wrong_parity(model):
    def producer(units, q_stages=2):
        q_iter = 0
        for steps in units + [None]:
            yield ("sync", model.UNIT)
            if steps is None:
                return
            if steps > 0:
                yield ("mb_arrive", "kv_full")
            for _ in range(steps):
                stage, phase = q_iter % q_stages, (q_iter // q_stages) & 1
                yield ("mb_wait", f"q_empty{stage}", phase)
                yield ("mb_arrive", f"q_full{stage}")
                q_iter += 1
            yield ("sync", model.UNIT)
    return producer


@pytest.mark.parametrize("role, broken", [("writer", _writer_releasing_after_the_last_step),
                                          ("producer", _producer_on_the_wrong_parity)])
def test_model_catches_protocol_mistakes(model, monkeypatch, role, broken):
    monkeypatch.setattr(model, role, broken(model))
    rng, sequences = _unit_sequences(7, 200)
    caught = 0
    for units in sequences:
        try:
            model.run(units, rng, 2)
        except (model.Deadlock, AssertionError):
            caught += 1
    assert caught > 100


@pytest.mark.parametrize("warpgroups", [2, 3])
def test_forward_protocol_never_deadlocks(model, warpgroups):
    rng = random.Random(3)
    for n_end in list(range(0, 13)) * 40:
        model.run_forward(n_end, rng, warpgroups)


def _math_without_the_first_hand_over(original, model):
    def forward_math(n_end, wg, warpgroups=2):
        ops = original(n_end, wg, warpgroups)
        if wg == warpgroups - 1 and n_end > 0:
            next(ops)  # drop the initial arrive that lets the first warpgroup go first
        return ops
    return forward_math


def _math_handing_over_after_the_last_turn(original, model):
    def forward_math(n_end, wg, warpgroups=2):
        yield from original(n_end, wg, warpgroups)
        if wg == warpgroups - 1 and n_end > 0:  # the hand-over the kernel skips
            yield ("arrive", model.TURN[0])
    return forward_math


def _math_handing_over_to_the_wrong_warpgroup(original, model):
    # two warpgroups' ping-pong rule (hand to wg ^ 1) kept with three
    def forward_math(n_end, wg, warpgroups=2):
        for op in original(n_end, wg, warpgroups):
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
