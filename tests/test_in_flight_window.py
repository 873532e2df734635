"""The adaptive bound on requests in flight (sira.pipelines.enrichment.llm_backends.InFlightWindow): grows while the server keeps up,
halves once a round when it pushes back, stays within [1, limit]. Pure asyncio, no server."""

import asyncio

from sira.pipelines.enrichment.llm_backends import InFlightWindow


async def one_round(window: InFlightWindow, pushed_back: bool) -> int:
    """Send as many requests as the window lets through at once, then answer them all; returns how many went out."""
    tickets = []
    while window.in_flight < int(window.size):
        tickets.append(await window.acquire())
    for ticket in tickets:
        await window.release(ticket, pushed_back)
    return len(tickets)


def test_the_window_doubles_every_round_until_its_limit():
    async def run():
        window = InFlightWindow(limit=100, start=16)
        assert [await one_round(window, pushed_back=False) for _ in range(4)] == [16, 32, 64, 100]
        assert window.size == 100

    asyncio.run(run())


def test_a_push_back_halves_the_window_once_a_round_then_it_grows_by_one_a_round():
    async def run():
        window = InFlightWindow(limit=100, start=16)
        assert await one_round(window, pushed_back=True) == 16
        assert window.size == 8  # sixteen push-backs from one round: one halving
        assert await one_round(window, pushed_back=False) == 8
        assert 8.9 < window.size <= 9.0  # +1/size per answer: about one a round
        for _ in range(10):
            await one_round(window, pushed_back=True)
        assert window.size == 1  # never below one request at a time

    asyncio.run(run())


def test_a_request_waits_for_room_and_goes_out_when_an_answer_frees_it():
    async def run():
        window = InFlightWindow(limit=1, start=1)
        first = await window.acquire()
        waiting = asyncio.ensure_future(window.acquire())
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await window.release(first, pushed_back=False)
        await asyncio.wait_for(waiting, 1)
        assert window.in_flight == 1

    asyncio.run(run())
