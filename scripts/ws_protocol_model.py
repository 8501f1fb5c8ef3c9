"""A model of one CTA of the warp-specialized backward (cuda/sm90/bwd/), and of the
warp-specialized forward (cuda/sm90/fwd/): the order in which their roles meet at named
barriers and mbarriers, run under many random interleavings and unit
sequences (including units with no steps), to show that no interleaving deadlocks and that every
barrier generation is met by exactly the threads it counts. It models the code as written; it has
to be kept in step with the kernel by hand (the comments name the code it mirrors).

    python scripts/ws_protocol_model.py [--trials N] [--seed S] [--ds-stages 1|2] [--q-stages 1|2]

dq_in_stage (head_dim 256, WsTraits::kdQInStage): the math stores each step's dQ partial into that
step's Q/dO stage once both warpgroups are done with it (a math barrier), hands it to the writer on
the stage's own dQ-full barrier, and the writer, not the math, frees the stage for the producer
(q_empty, one arrival) once its bulk reduction has read the partial: no dQ-empty barrier.

Outside dq_in_stage each math warpgroup hands its half of a step's dQ partial (the fragment chunks
of its 128 threads) to the step's writer on a dQ-full/dQ-empty barrier pair of its own (one writer
+ one warpgroup), as FlashAttention-3 does: the two warpgroups meet once a step (PDS), not again at
the dQ buffer. The writer starts each half's bulk reduction once its warpgroup has stored it
(warpgroup 0's first), then frees warpgroup 0's half and 1's as their reads complete.

Roles: P (producer warp), W0 and W1 (the two dQ writer warps of the unmasked kernels and the
window/lengths kernel at head_dim 128: W0 takes the even steps of a unit, or with dq_in_stage the
steps of stage 0, W1 the others; the other masked kernels run W0 alone), M0 and M1 (M2: the
forward's third at head_dim 64) (the math warpgroups, each one actor: their threads run the same
program). Named barriers count arrivals per generation (bar.sync waits for the generation it joined
to complete, bar.arrive does not wait); an mbarrier counts arrivals per phase, and a wait on parity
p passes once the phase of that parity has completed. Tickets are outside one CTA (the schedule
simulator, jax_dash/schedules.py, covers them) and are not modelled.
"""

from __future__ import annotations

import argparse
import random

# Named barriers and their thread counts, in actors: UNIT = P + the writers + M0 + M1; a stage's
# dQ-full barrier (dq_in_stage) = its writer + M0 + M1; a warpgroup's dQ barrier (dq_full(w, g),
# dq_empty(w, g)) = writer w + math warpgroup g (named_barrier.cuh dq_full_barrier(w, g)).
UNIT, PDS, MATH, DQ_FULL, DQ_EMPTY, DQ_FULL1, DQ_EMPTY1 = 1, 2, 3, 4, 5, 6, 7
DQ_FULL_OF = (DQ_FULL, DQ_FULL1)    # writer w's dQ-full barriers (dq_in_stage: stage s's)
DQ_EMPTY_OF = (DQ_EMPTY, DQ_EMPTY1)  # writer w's dQ-empty barriers
COUNTS = {UNIT: 5, PDS: 2, MATH: 2, DQ_FULL: 3, DQ_FULL1: 3}
for _g in (0, 1):
    for _bar in DQ_FULL_OF + DQ_EMPTY_OF:
        COUNTS[(_bar, _g)] = 2


def dq_full(w, g):
    """Writer w's dQ-full barrier for math warpgroup g's half of a partial."""
    return (DQ_FULL_OF[w], g)


def dq_empty(w, g):
    """Writer w's dQ-empty barrier for math warpgroup g's half of a buffer."""
    return (DQ_EMPTY_OF[w], g)


WRITERS = 2  # unmasked, window/lengths hd128 kernels; the other masked ones: 1 (kdQWriters)
STAGES = 2  # the Q/dO ring (WsTraits::kStages; 1 was the first head_dim-256 kernel's, kept modelled)


class Deadlock(Exception):
    pass


class CTA:
    def __init__(self, counts=None, q_stages=STAGES, dq_in_stage=False):
        self.counts = counts or COUNTS
        self.named = {b: {"gen": 0, "arrived": set()} for b in self.counts}
        # mbarriers: arrivals expected per phase, arrivals so far, completed phases.
        # unit_fetched: the first math thread (M0's) hands a fetched unit to the producer
        self.mbar = {"kv_full": [1, 0, 0], "unit_fetched": [1, 0, 0]}
        for s in range(q_stages):
            self.mbar[f"q_full{s}"] = [1, 0, 0]
            # one arrival per math actor (8 warps in the code), or (dq_in_stage) the writer's one
            self.mbar[f"q_empty{s}"] = [1 if dq_in_stage else 2, 0, 0]
        # dQ buffer halves, (buffer, warpgroup): [the step whose half it holds, read yet]
        self.dq = {}
        # K's and V's tiles: the unit whose K/V the last load brought, and the math actors using
        # them (the unit's steps and its epilogue, until the dK/dV stores have read the tiles)
        self.kv_unit = None
        self.kv_users = set()

    # named barriers
    def arrive(self, bar, actor):
        n = self.named[bar]
        if actor in n["arrived"]:  # would complete a generation with another actor missing
            raise AssertionError(f"{actor} arrives twice at barrier {bar} generation {n['gen']}")
        n["arrived"].add(actor)
        gen = n["gen"]
        if len(n["arrived"]) == self.counts[bar]:
            n["gen"] += 1
            n["arrived"] = set()
        return gen

    def done(self, bar, gen):
        return self.named[bar]["gen"] > gen

    # mbarriers
    def mb_arrive(self, name):
        m = self.mbar[name]
        m[1] += 1
        if m[1] == m[0]:
            m[1] = 0
            m[2] += 1

    def mb_passes(self, name, parity):
        return self.mbar[name][2] % 2 != parity


def producer(units, q_stages=STAGES, kv_first=False):
    """kv_first (UnitScheduler::kKVFirst, the unmasked kernels): K and V, and the unit's first
    Q/dO stage, are loaded once the first math thread has handed the fetched unit over (the
    unit_fetched mbarrier), before the unit barrier (K and V whatever the unit's step count); else
    after the unit barrier, K and V only for a unit with steps."""
    q_iter = 0
    for unit, steps in enumerate(units + [None]):
        first = 0
        if kv_first:
            yield ("mb_wait", "unit_fetched", unit & 1)  # [A]: the unit fetched
        if kv_first and steps is not None:
            yield ("kv_load", unit)                # TMA of K, V (expect_tx + completion)
            first = min(steps, 1)
        for _ in range(first):                     # the first stage (unit tables in global memory)
            yield ("mb_wait", f"q_empty{q_iter % q_stages}", ((q_iter // q_stages) & 1) ^ 1)
            yield ("mb_arrive", f"q_full{q_iter % q_stages}")
            q_iter += 1
        yield ("sync", UNIT)                       # [B]: its visit order, tickets, step count
        if steps is None:
            return
        if not kv_first and steps > 0:
            yield ("kv_load", unit)
        for _ in range(first, steps):
            stage, phase = q_iter % q_stages, (q_iter // q_stages) & 1
            yield ("mb_wait", f"q_empty{stage}", phase ^ 1)
            yield ("mb_arrive", f"q_full{stage}")  # TMA Q, dO + bulk lse, dsum
            q_iter += 1
        yield ("sync", UNIT)                       # [C]


def writer(units, w, q_stages=STAGES, dq_in_stage=False, dq_buffers=1, writers=None):
    """dQ writer warp w (cuda/sm90/bwd/dq_writer.cuh): the steps s of a unit with s % 2 == w
    (dq_in_stage: those in stage w). Buffer s % dq_buffers holds step s's partial; math warpgroup g
    stores its half of step s after a sync on its empty barrier of the writer of step
    s - dq_buffers, so writer w frees its buffers' halves on its own empty barriers (at the unit's
    start for the first steps). With one writer (writers=1) every step is writer 0's."""
    writers = writers or WRITERS
    q_iter = 0
    for unit, steps in enumerate(units + [None]):
        yield ("sync", UNIT)
        if steps is None:
            return
        if dq_in_stage:
            for _ in range(steps):
                stage = q_iter % q_stages
                q_iter += 1
                if stage % writers != w:
                    continue
                yield ("sync", DQ_FULL_OF[stage])  # math stored dQ into the stage
                # bulk reductions; wait_group.read
                yield ("mb_arrive", f"q_empty{stage}")   # the stage is free for the producer
                # wait_group 0; release the ticket
            yield ("sync", UNIT)
            continue
        for j in range(min(dq_buffers, steps)):   # buffers free for the unit's first steps
            if (j + dq_buffers) % writers == w:
                for g in (0, 1):
                    yield ("arrive", dq_empty(w, g))
        for s in range(steps):
            if s % writers != w:
                continue
            for g in (0, 1):
                yield ("sync", dq_full(w, g))      # warpgroup g stored its half: bulk reduce
            for g in (0, 1):
                yield ("dq_read", (unit, s), s % dq_buffers, g)  # wait_group.read 1, then 0
                if s + dq_buffers < steps:
                    yield ("arrive", dq_empty(w, g))
            # wait_group 0; release the ticket
        yield ("sync", UNIT)


def math(units, ds_stages, q_stages=STAGES, dq_in_stage=False, dq_buffers=1, writers=None, g=0,
         next_s=False, kv_first=False):
    """Math warpgroup g. next_s (the unmasked kernels' kNextS, outside dq_in_stage): each step's
    S^T is issued by the step before, after its dQ stores and before its dQ-full arrival, so the
    wait for the next step's Q/dO stage comes while this step's stage is still held (the unit's
    first at the unit's start; the last step waits on its own stage again, already full).
    kv_first: K and V are waited for in every unit (the producer loads them before it knows the
    step count)."""
    writers = writers or WRITERS
    q_iter = 0
    kv_loads = 0
    for unit, steps in enumerate(units + [None]):
        yield ("sync", MATH)                       # the fetch published to the math threads
        if g == 0:  # the first math thread, once the dK/dV stores have read the tiles
            if unit > 0:
                yield ("kv_end",)
            if kv_first:
                yield ("mb_arrive", "unit_fetched")  # [A]
        yield ("sync", UNIT)                       # [B]: after the math copied the tables
        if steps is None:
            return
        if steps > 0:
            yield ("mb_wait", "kv_full", kv_loads & 1)
            kv_loads += 1
        yield ("kv_begin", unit, steps > 0)        # the steps and the epilogue use the tiles
        for s in range(steps):
            stage = q_iter % q_stages
            if not next_s or s == 0:
                yield ("mb_wait", f"q_full{stage}", (q_iter // q_stages) & 1)
            if ds_stages == 1:
                yield ("sync", MATH)               # the other warpgroup is past its dQ wgmma
            yield ("sync", PDS)
            if dq_in_stage:
                yield ("sync", MATH)               # both warpgroups' wgmmas done with the stage
                yield ("arrive", DQ_FULL_OF[stage])  # dQ stored into the stage
            else:
                # the writer of step s - dq_buffers has read this warpgroup's half of the buffer
                yield ("sync", dq_empty((s + dq_buffers) % writers, g))
                yield ("dq_store", (unit, s), s % dq_buffers, g)
                if next_s:  # the next step's S^T (the last step: its own again)
                    nxt = q_iter + 1 if s + 1 < steps else q_iter
                    yield ("mb_wait", f"q_full{nxt % q_stages}", (nxt // q_stages) & 1)
                yield ("arrive", dq_full(s % writers, g))
                yield ("mb_arrive", f"q_empty{stage}")
            q_iter += 1
        if kv_first and steps == 0:                # loaded anyway: landed before the epilogue
            yield ("mb_wait", "kv_full", kv_loads & 1)
            kv_loads += 1
            yield ("kv_begin", unit, True)
        if g == 1:  # its dK/dV are in the tiles; the first math thread stores them (TMA)
            yield ("kv_end",)
        yield ("sync", UNIT)                       # [C]


def run(units, rng, ds_stages, q_stages=STAGES, dq_in_stage=False, dq_buffers=1, writers=None,
        next_s=False, kv_first=False):
    writers = writers or WRITERS
    actors = {"P": producer(units, q_stages, kv_first)}
    for g in (0, 1):
        actors[f"M{g}"] = math(units, ds_stages, q_stages, dq_in_stage, dq_buffers, writers, g,
                               next_s, kv_first)
    for w in range(writers):
        actors[f"W{w}"] = writer(units, w, q_stages, dq_in_stage, dq_buffers, writers)
    counts = dict(COUNTS)
    counts[UNIT] = 3 + writers
    _interleave(CTA(counts, q_stages=q_stages, dq_in_stage=dq_in_stage), actors, rng,
                f"units {units} q_stages {q_stages} dq_in_stage {dq_in_stage} "
                f"dq_buffers {dq_buffers} writers {writers} next_s {next_s} kv_first {kv_first}")


# ---- forward (cuda/sm90/fwd/): producer thread, two or three math warpgroups taking turns ----
#
# A forward tile is (n_end, firsts): its KV step count and, per math warpgroup, the first step the
# warpgroup computes (fwd_kernel's `first`: the steps before it are hidden from all its rows, and it
# takes their turns and releases their stages without a wgmma). The persistent kernel (kPersistent)
# runs several tiles per CTA: the stage ring and Q's barrier run on across them, and the math
# releases Q (q_empty) after the tile's last S = Q K^T. mbarrier arrivals carry the phase they are
# meant for (the stage's use count, or the tile's Q count): an arrival that lands in another phase
# (a warpgroup one round of the ring ahead) is an error even where nothing deadlocks.

TURN = (1, 2, 3)  # kTurnBarrier + warpgroup


class ForwardCTA(CTA):
    """The producer's TMA loads land later, in any order (the copy engine; "TMA" lands one at a
    time): a load issued into a stage whose previous load has not landed yet is an error (two
    transactions on one phase), which a model where loads land when issued could not see."""

    def __init__(self, warpgroups=2):
        # turn barrier w: warpgroup w waits there, its predecessor arrives
        super().__init__({TURN[w]: 2 for w in range(warpgroups)})
        self.in_flight = []
        self.mbar = {"bar_q": [1, 0, 0], "q_empty": [warpgroups, 0, 0]}
        # The persistent scheduler's hand-over ring (fwd/scheduler.cuh): entry e holds hand-over
        # slots[e] (the CTA's tile index, or len(tiles) for the end), read so far by the math
        # warpgroups in readers[e]
        self.warpgroups = warpgroups
        self.slots = [None, None]
        self.readers = [set(), set()]
        for e in range(2):
            self.mbar[f"slot_full{e}"] = [1, 0, 0]
            self.mbar[f"slot_empty{e}"] = [warpgroups, 0, 0]
        for s in range(STAGES):
            for name, count in (("bar_k", 1), ("bar_v", 1), ("k_empty", warpgroups),
                                ("v_empty", warpgroups)):
                self.mbar[f"{name}{s}"] = [count, 0, 0]


def _stage(name, it):
    """(mbarrier of iteration it's stage, the phase index that iteration's use of it has)."""
    return f"{name}{it % STAGES}", it // STAGES


def _publish(i):
    """The producer's hand-over i (FwdPersistentTileScheduler::publish): wait until the math has
    read hand-over i - 2 from the entry, write, arrive on the entry's full barrier."""
    entry = f"{i % 2}"
    yield ("mb_wait", "slot_empty" + entry, ((i // 2) & 1) ^ 1)
    yield ("slot_store", i % 2, i)
    yield ("mb_arrive", "slot_full" + entry, i // 2)


def _take(i):
    """A math warpgroup's read of hand-over i (FwdPersistentTileScheduler::math_tiles)."""
    entry = f"{i % 2}"
    yield ("mb_wait", "slot_full" + entry, (i // 2) & 1)
    yield ("slot_load", i % 2, i)
    yield ("mb_arrive", "slot_empty" + entry, i // 2)


def forward_producer(tiles, persistent=False):
    """persistent: the scheduler hands each tile (and, after the last, the end) to the math
    through the two-entry ring, tile i + 1's as tile i's producer work begins."""
    kv_base = q_count = 0
    if persistent:
        yield from _publish(0)
    for i, (n_end, _) in enumerate(tiles):
        if persistent:
            yield from _publish(i + 1)
        if n_end == 0:
            continue
        if persistent and q_count > 0:
            yield ("mb_wait", "q_empty", (q_count - 1) & 1)
        yield ("tma", "bar_q", q_count)
        for j in range(n_end):
            it = kv_base + j
            empty_phase = ((it // STAGES) & 1) ^ 1
            yield ("mb_wait", _stage("k_empty", it)[0], empty_phase)
            yield ("tma", *_stage("bar_k", it))
            yield ("mb_wait", _stage("v_empty", it)[0], empty_phase)
            yield ("tma", *_stage("bar_v", it))
        kv_base += n_end
        q_count += 1


def forward_math(tiles, wg, warpgroups=2, persistent=False, chain=False):
    """chain (persistent at head_dim 64, FwdMainloop::kChainTurns): the turns run on from tile to
    tile (one opening arrive a CTA, every tile's last hand-over made, the first warpgroup taking
    the last one after its last tile)."""
    assert persistent or not chain
    last_wg = warpgroups - 1
    kv_base = q_count = 0
    turns_begun = False

    def wait(name, it):
        mbar, phase = _stage(name, it)
        return ("mb_wait", mbar, phase & 1)

    for i, (n_end, firsts) in enumerate(tiles):
        if persistent:
            yield from _take(i)
        first = firsts[wg]

        def turn_end(turn, n_end=n_end):
            # without chain, the last warpgroup's last hand-over is skipped
            if chain or not (wg == last_wg and turn == n_end):
                yield ("arrive", TURN[0 if wg == last_wg else wg + 1])

        def release_q_after(j, n_end=n_end, q_count=q_count):
            if persistent and j == n_end - 1:
                yield ("mb_arrive", "q_empty", q_count)

        if wg == last_wg and n_end > 0 and not (chain and turns_begun):
            yield ("arrive", TURN[0])  # the first warpgroup goes first
        turns_begun = turns_begun or n_end > 0
        if n_end > 0:
            yield ("mb_wait", "bar_q", q_count & 1)
            for t in range(first):  # skipped turns: the turn's waits, no wgmma
                yield ("sync", TURN[wg])
                yield wait("bar_k", kv_base + t)
                if t > 0:
                    yield wait("bar_v", kv_base + t - 1)
                yield ("mb_arrive", *_stage("k_empty", kv_base + t))
                if t > 0:
                    yield ("mb_arrive", *_stage("v_empty", kv_base + t - 1))
                yield from release_q_after(t)
                yield from turn_end(t)
            if first < n_end:
                yield ("sync", TURN[wg])
                yield wait("bar_k", kv_base + first)                          # issue_qk(first)
                yield from turn_end(first)
                yield ("mb_arrive", *_stage("k_empty", kv_base + first))      # S complete
                if first > 0:  # V_{first-1} landed before its stage is released
                    yield wait("bar_v", kv_base + first - 1)
                    yield ("mb_arrive", *_stage("v_empty", kv_base + first - 1))
                yield from release_q_after(first)
        for it in range(first + 1, n_end):
            yield ("sync", TURN[wg])
            yield wait("bar_k", kv_base + it)                                 # issue_qk(it)
            yield wait("bar_v", kv_base + it - 1)                             # issue_pv(it - 1)
            yield from turn_end(it)
            yield ("mb_arrive", *_stage("k_empty", kv_base + it))             # after wait<1>
            yield from release_q_after(it)
            if persistent:                                                    # scheduling fence
                yield wait("bar_v", kv_base + it - 1)
            else:
                yield ("mb_wait", "bar_q", q_count & 1)
            yield ("mb_arrive", *_stage("v_empty", kv_base + it - 1))         # after wait<0>
        if n_end > 0:
            yield ("sync", TURN[wg])
            yield wait("bar_v", kv_base + n_end - 1)  # issue_pv, or the skipped turn's wait
            yield from turn_end(n_end)
            if persistent:
                yield ("mb_arrive", *_stage("v_empty", kv_base + n_end - 1))
            kv_base += n_end
            q_count += 1
    if persistent:
        yield from _take(len(tiles))  # the end
    if chain and wg == 0 and turns_begun:
        yield ("sync", TURN[0])  # the last warpgroup's hand-over after the last tile


def run_forward(n_end, rng, warpgroups=2, firsts=None):
    """One tile of the one-tile kernel; firsts defaults to no skipped step."""
    tiles = [(n_end, tuple(firsts) if firsts is not None else (0,) * warpgroups)]
    run_forward_tiles(tiles, rng, warpgroups, persistent=False)


def tma_engine():
    while True:
        yield ("tma_land",)


def run_forward_tiles(tiles, rng, warpgroups=2, persistent=True, chain=False):
    assert persistent or len(tiles) <= 1, "the one-tile kernel runs one tile"
    actors = {"P": forward_producer(tiles, persistent), "TMA": tma_engine()}
    for wg in range(warpgroups):
        actors[f"M{wg}"] = forward_math(tiles, wg, warpgroups, persistent, chain)
    _interleave(ForwardCTA(warpgroups), actors, rng,
                f"tiles {tiles}, {warpgroups} warpgroups, persistent {persistent}, chain {chain}")


def random_firsts(rng, n_end, warpgroups):
    """Skipped steps per warpgroup: any number each. (The kernel's tiles always have a warpgroup
    computing every step, the one holding the tile's last valid row; the protocol does not need
    it, since a skipping warpgroup's first computing turn waits for V_{first-1}.)"""
    return tuple(rng.randint(0, n_end) for _ in range(warpgroups))


def random_forward_tiles(rng, warpgroups, max_tiles=4, max_steps=6):
    tiles = []
    for _ in range(rng.randint(1, max_tiles)):
        n_end = rng.choice((0,) + tuple(range(1, max_steps + 1)))
        tiles.append((n_end, random_firsts(rng, n_end, warpgroups)))
    return tiles


def _interleave(cta, actors, rng, what):
    pending = {name: None for name in actors}
    live = set(actors)
    while live:
        if live == {"TMA"} and not cta.in_flight:  # every load has landed, nobody is left
            break
        runnable = [n for n in sorted(live) if pending[n] is None or _ready(cta, pending[n])]
        if not runnable:
            raise Deadlock(f"{what}: blocked {({n: pending[n] for n in live})}")
        name = rng.choice(runnable)
        if pending[name] is not None:
            if pending[name][0] == "tma_land":  # one in-flight load lands, any of them
                cta.mb_arrive(cta.in_flight.pop(rng.randrange(len(cta.in_flight))))
            pending[name] = None
            continue
        try:
            op = next(actors[name])
        except StopIteration:
            live.discard(name)
            continue
        if op[0] == "sync":
            pending[name] = ("joined", op[1], cta.arrive(op[1], name))
        elif op[0] == "arrive":
            cta.arrive(op[1], name)
        elif op[0] == "tma":  # issue: the stage's previous load must have landed
            if cta.mbar[op[1]][2] != op[2]:
                raise AssertionError(f"{what}: a load into {op[1]} for phase {op[2]} is issued "
                                     f"while that barrier has completed {cta.mbar[op[1]][2]}")
            cta.in_flight.append(op[1])
        elif op[0] == "tma_land":
            pending[name] = op
        elif op[0] == "dq_store":  # warpgroup op[3]'s half of step op[1]'s partial, buffer op[2]
            half = op[2:4]
            held = cta.dq.get(half)
            if held is not None and held[0] != op[1] and not held[1]:
                raise AssertionError(f"{what}: {name} stores step {op[1]} into dQ buffer half "
                                     f"{half} before step {held[0]}'s half was read")
            if held is not None and held[0] == op[1]:
                raise AssertionError(f"{what}: {name} stores step {op[1]} into {half} twice")
            cta.dq[half] = [op[1], False]
        elif op[0] == "dq_read":  # the writer reads warpgroup op[3]'s half of buffer op[2]
            half = op[2:4]
            held = cta.dq.get(half)
            if held is None or held[0] != op[1] or held[1]:
                raise AssertionError(f"{what}: {name} reads dQ buffer half {half} for step "
                                     f"{op[1]} holding {held}")
            held[1] = True
        elif op[0] == "slot_store":  # the producer writes hand-over op[2] into entry op[1]
            held = cta.slots[op[1]]
            if held is not None and len(cta.readers[op[1]]) < cta.warpgroups:
                raise AssertionError(f"{what}: hand-over {op[2]} written over {held}, read by "
                                     f"{sorted(cta.readers[op[1]])} only")
            cta.slots[op[1]] = op[2]
            cta.readers[op[1]] = set()
        elif op[0] == "slot_load":  # a math warpgroup reads hand-over op[2] from entry op[1]
            if cta.slots[op[1]] != op[2]:
                raise AssertionError(f"{what}: {name} reads hand-over {op[2]} from an entry "
                                     f"holding {cta.slots[op[1]]}")
            cta.readers[op[1]].add(name)
        elif op[0] == "kv_load":  # K and V of unit op[1] into their tiles
            if cta.kv_users:
                raise AssertionError(f"{what}: K/V of unit {op[1]} loaded while "
                                     f"{sorted(cta.kv_users)} use unit {cta.kv_unit}'s")
            cta.kv_unit = op[1]
            cta.mb_arrive("kv_full")
        elif op[0] == "kv_begin":  # (unit, whether its K/V must be there)
            if op[2] and cta.kv_unit != op[1]:
                raise AssertionError(f"{what}: {name} runs unit {op[1]} on unit "
                                     f"{cta.kv_unit}'s K/V")
            cta.kv_users.add(name)
        elif op[0] == "kv_end":
            cta.kv_users.discard(name)
        elif op[0] == "mb_arrive":
            if len(op) > 2 and cta.mbar[op[1]][2] != op[2]:
                raise AssertionError(f"{what}: {name}'s arrival on {op[1]} meant for phase {op[2]} "
                                     f"lands in phase {cta.mbar[op[1]][2]}")
            cta.mb_arrive(op[1])
        else:
            pending[name] = op
    leftovers = {b: sorted(n["arrived"]) for b, n in cta.named.items() if n["arrived"]}
    if leftovers:
        raise AssertionError(f"{what}: partial barrier generations left {leftovers}")


def _ready(cta, op):
    if op[0] == "tma_land":
        return bool(cta.in_flight)
    if op[0] == "joined":
        return cta.done(op[1], op[2])
    if op[0] == "mb_wait":
        return cta.mb_passes(op[1], op[2])
    raise ValueError(op)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ds-stages", type=int, choices=(1, 2), default=None,
                        help="dS^T buffers (hd64 ws: 1; else 2); default: both")
    parser.add_argument("--q-stages", type=int, choices=(1, 2), default=None,
                        help="Q/dO ring stages (the kernels: 2); default: both")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    for q_stages in ((args.q_stages,) if args.q_stages else (1, 2)):
        for ds_stages in ((args.ds_stages,) if args.ds_stages else (1, 2)):
            for dq_in_stage, dq_buffers in ((False, 1), (False, 2), (True, 1)):
                for writers in ((2,) if dq_buffers == 2 else (1, 2)):  # kernels: 1 buffer with 1
                    # next_s: the unmasked kernels (two writers, two stages, not dq_in_stage)
                    ok_next = writers == 2 and q_stages == 2 and not dq_in_stage
                    for next_s in ((False, True) if ok_next else (False,)):
                        for kv_first in (False, True):
                            for _ in range(args.trials):
                                units = [rng.choice((0, 0, 1, 2, 3, 5))
                                         for _ in range(rng.randint(0, 6))]
                                run(units, rng, ds_stages, q_stages, dq_in_stage, dq_buffers,
                                    writers, next_s, kv_first)
    for warpgroups in (2, 3):
        for _ in range(args.trials):
            n_end = rng.randint(0, 9)
            run_forward(n_end, rng, warpgroups, random_firsts(rng, n_end, warpgroups))
            for chain in (False, True):
                run_forward_tiles(random_forward_tiles(rng, warpgroups), rng, warpgroups,
                                  chain=chain)
    print(f"ok: backward {args.trials} random unit sequences per (Q/dO stages, dS^T buffers, dQ "
          "buffers 1 or 2 or dQ in the stage, one or two dQ writer warps, S^T issued a step "
          "ahead or not, K/V loaded before the tables or after) setting, forward "
          f"{args.trials} random one-tile KV counts with skipped steps and {args.trials} random "
          "persistent tile sequences per warpgroup count (2, 3) and turn chaining (off, on), "
          "each under a random "
          "interleaving: no deadlock, every barrier generation complete, every mbarrier arrival "
          "in its phase")


if __name__ == "__main__":
    main()
