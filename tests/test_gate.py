"""The Ollama gate: its pure decisions, and the async shell that carries them out."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.llm.gate import (
    Busy,
    Gate,
    GatePolicy,
    Priority,
    Running,
    SessionQueued,
    Waiting,
    decide,
    is_preemption,
)

I, B = Priority.INTERACTIVE, Priority.BACKGROUND  # noqa: E741 - reads as the two classes


def test_interactive_first_in_arrival_order() -> None:
    """A free slot goes to the earliest interactive waiter, even if background came first."""
    waiting = [Waiting(1, B, 0.0), Waiting(2, I, 2.0), Waiting(3, I, 1.0)]
    assert decide(GatePolicy(slots=1), [], waiting, now=3.0).grant == (3,)


def test_background_keeps_one_slot_free_with_two_or_more() -> None:
    """With 2+ slots and a turn about, background holds at most slots - 1; idle, it may fill the last one
    only while it can still be preempted."""
    waiting = [Waiting(i, B, float(i)) for i in range(1, 5)]
    assert decide(GatePolicy(slots=3), [Running(9, I)], waiting, now=5.0).grant == (1, 2)
    assert decide(GatePolicy(slots=3), [], waiting, now=5.0).grant == (1, 2, 3)
    spent = [Waiting(i, B, float(i), preemptible=False) for i in range(1, 5)]
    assert decide(GatePolicy(slots=3), [], spent, now=5.0).grant == (1, 2)
    assert decide(GatePolicy(slots=1), [], waiting, now=5.0).grant == (1,)


def test_waiting_turn_preempts_running_background_once_budget_allows() -> None:
    """With one slot, a waiting turn takes the slot back from a preemptible background call only."""
    policy = GatePolicy(slots=1)
    assert decide(policy, [Running(1, B, preemptible=True)], [Waiting(2, I, 0.0)], 1.0).preempt == (1,)
    assert decide(policy, [Running(1, B, preemptible=False)], [Waiting(2, I, 0.0)], 1.0).preempt == ()
    assert decide(policy, [Running(1, I)], [Waiting(2, I, 0.0)], 1.0).preempt == ()


def test_aged_background_is_served_before_later_turns() -> None:
    """Aging: a background call waiting longer than aging_s is ordered with the turns, so it never starves."""
    policy = GatePolicy(slots=1, aging_s=10.0)
    waiting = [Waiting(1, B, 0.0), Waiting(2, I, 5.0)]
    assert decide(policy, [], waiting, now=6.0).grant == (2,)
    assert decide(policy, [], waiting, now=11.0).grant == (1,)


def test_turn_slots_answer_turns_few_at_a_time_and_keep_background_behind() -> None:
    """With turn_slots 1 of 3 slots, one turn holds a slot at a time; a turn held back by that bound neither lets
    background in ahead of it nor preempts it; once no turn is about, background fills the slots."""
    policy = GatePolicy(slots=3, turn_slots=1)
    waiting = [Waiting(1, I, 0.0), Waiting(2, I, 1.0), Waiting(3, B, 2.0)]
    assert decide(policy, [], waiting, now=3.0).grant == (1,)
    held = decide(policy, [Running(9, I), Running(8, B, preemptible=True)], waiting[1:], now=3.0)
    assert held.grant == () and held.preempt == ()
    assert decide(policy, [], [Waiting(3, B, 2.0), Waiting(4, B, 2.5)], now=3.0).grant == (3, 4)


@given(
    slots=st.integers(1, 4),
    turn_slots=st.integers(0, 4),
    running=st.lists(st.sampled_from([I, B]), max_size=4),
    waiting=st.lists(st.tuples(st.sampled_from([I, B]), st.floats(0, 100)), max_size=8),
)
def test_turns_never_more_than_turn_slots(
    slots: int, turn_slots: int, running: list[Priority], waiting: list[tuple[Priority, float]]
) -> None:
    """Property: interactive leases held after a decision never exceed turn_slots (when set), nor slots."""
    turn_slots = min(turn_slots, slots)
    running = running[:slots]
    r = [Running(i, p, preemptible=True) for i, p in enumerate(running)]
    w = [Waiting(100 + i, p, t) for i, (p, t) in enumerate(waiting)]
    d = decide(GatePolicy(slots=slots, turn_slots=turn_slots, aging_s=1e9), r, w, now=200.0)
    kinds = {x.id: x.priority for x in w}
    turns = sum(1 for p in running if p is I) + sum(1 for g in d.grant if kinds[g] is I)
    assert turns <= max(turn_slots or slots, sum(1 for p in running if p is I))
    assert len(d.grant) <= slots - len(r)


@given(
    slots=st.integers(1, 4),
    running=st.lists(st.sampled_from([I, B]), max_size=4),
    waiting=st.lists(st.tuples(st.sampled_from([I, B]), st.floats(0, 100)), max_size=8),
)
def test_never_more_than_slots(slots: int, running: list[Priority], waiting: list[tuple[Priority, float]]) -> None:
    """Property: grants never exceed free slots, and background never takes the last slot when slots > 1."""
    running = running[:slots]
    r = [Running(i, p, preemptible=True) for i, p in enumerate(running)]
    w = [Waiting(100 + i, p, t) for i, (p, t) in enumerate(waiting)]
    d = decide(GatePolicy(slots=slots, aging_s=1e9), r, w, now=200.0)
    assert len(d.grant) <= slots - len(r)
    kinds = {x.id: x.priority for x in w}
    bg = sum(1 for p in running if p is B) + sum(1 for g in d.grant if kinds[g] is B)
    turns = any(p is I for p in running) or any(p is I for p, _ in waiting)
    if slots > 1 and turns and any(kinds[g] is B for g in d.grant):
        assert bg <= slots - 1
    assert len(d.preempt) <= sum(1 for p in running if p is B)


async def test_bound_holds_under_64_concurrent_turns() -> None:
    """64 sessions at once: never more than `slots` leases held, everyone served."""
    gate = Gate("t", GatePolicy(slots=2))

    async def turn(i: int) -> None:
        async with gate.lease(I, session=f"s{i}"):
            await asyncio.sleep(0.001)

    await asyncio.wait_for(asyncio.gather(*(turn(i) for i in range(64))), 30)
    assert gate.max_running == 2
    assert gate.stats[I].served == 64


async def test_busy_at_once_with_retry_after() -> None:
    """A full queue answers Busy with a retry-after at once; a second turn of one session is SessionQueued."""
    gate = Gate("t", GatePolicy(slots=1, max_queue=2))
    held = await gate.acquire(I, session="a")
    waiters = [asyncio.create_task(gate.acquire(I, session=s)) for s in ("b", "c")]
    await asyncio.sleep(0)
    with pytest.raises(Busy) as e:
        await asyncio.wait_for(gate.acquire(I, session="d"), 1)
    assert e.value.retry_after >= 1
    gate.policy = GatePolicy(slots=1, max_queue=10)
    with pytest.raises(SessionQueued):
        await asyncio.wait_for(gate.acquire(I, session="b"), 1)
    gate.release(held)
    for t in waiters:
        gate.release(await asyncio.wait_for(t, 5))
    assert gate.busy == 1


async def test_cancelled_waiter_leaves_the_queue_and_holder_frees_slot() -> None:
    """A caller that goes away while waiting leaves no trace; one cancelled while holding frees its slot."""
    gate = Gate("t", GatePolicy(slots=1))

    async def hold() -> None:
        async with gate.lease(I, session="a"):
            await asyncio.sleep(30)

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(gate.acquire(I, session="b"))
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert gate.queued == 0
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    assert gate.running == 0
    lease = await asyncio.wait_for(gate.acquire(I, session="c"), 1)
    gate.release(lease)


async def test_turn_preempts_running_background_and_background_resumes() -> None:
    """One slot: a background call is cancelled by a waiting turn, re-queues, and finishes after it."""
    gate = Gate("t", GatePolicy(slots=1))
    order: list[str] = []

    async def background() -> None:
        arrived, pre = gate.clock(), 0
        while True:
            lease = await gate.acquire(B, arrived=arrived, preemptions=pre)
            try:
                await asyncio.sleep(0.3)
                order.append("background")
                return
            except asyncio.CancelledError as e:
                if not is_preemption(lease, e):
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                pre = lease.preemptions + 1
                order.append("preempted")
            finally:
                gate.release(lease)

    bg = asyncio.create_task(background())
    await asyncio.sleep(0.05)
    async with gate.lease(I, session="s"):
        order.append("turn")
    await asyncio.wait_for(bg, 5)
    assert order == ["preempted", "turn", "background"]
    assert gate.preemptions == 1


async def test_background_waiters_never_take_the_room_of_turns() -> None:
    """Each class has its own queue bound: background calls queued past `max_queue` refuse only background,
    and an arriving turn still queues (and is served first)."""
    gate = Gate("t", GatePolicy(slots=1, max_queue=2))
    held = await gate.acquire(I, session="a")
    background = [asyncio.create_task(gate.acquire(B)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(Busy):
        await asyncio.wait_for(gate.acquire(B), 1)
    assert gate.refusal(I) is None
    turn = asyncio.create_task(gate.acquire(I, session="b"))
    await asyncio.sleep(0)
    assert gate.queued_of(I) == 1 and gate.queued_of(B) == 2
    gate.release(held)
    got = await asyncio.wait_for(turn, 1)
    assert got.priority is I and not any(t.done() for t in background)
    gate.release(got)
    for t in background:
        gate.release(await asyncio.wait_for(t, 1))
