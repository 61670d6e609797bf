import asyncio
import concurrent.futures
import multiprocessing
import threading

import numpy as np
import pytest

from steplens.stream_jobs.engine.signals import arima
from steplens.stream_jobs.worker.fit_queue import FitQueue

ORDER, METHOD = (1, 1, 1), "hannan_rissanen"


def series(n, seed):
    rng = np.random.default_rng(seed)
    return [np.cumsum(rng.normal(0, 1, 128)) + 100 for _ in range(n)]


async def run_queue(pool, values, **kw):
    """Ask a fit of every series in one burst; the results by key and the queue."""
    got: dict[int, list] = {}
    q = FitQueue(pool, ORDER, METHOD, lambda k, p: got.setdefault(k, []).append(p), **kw)
    accepted = [q.want(i, v) for i, v in enumerate(values)]
    deadline = asyncio.get_running_loop().time() + 60
    while q.pending and asyncio.get_running_loop().time() < deadline:
        assert q.in_flight <= q.jobs
        await asyncio.sleep(0.01)
    return got, q, accepted


def test_a_burst_of_fits_goes_to_the_pool_in_few_jobs_with_every_result():
    values = series(300, seed=1)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        got, q, accepted = asyncio.run(run_queue(pool, values, max_batch=64))
    assert all(accepted) and q.pending == 0
    # the first fit goes alone to the idle pool, the other 299 wait and go 64 at a time
    assert q.submitted == 1 + -(-299 // 64)
    assert sorted(got) == list(range(300)) and all(len(v) == 1 for v in got.values())
    for i, v in enumerate(values):  # each key gets its own series' fit
        assert got[i][0] == arima.fit(v, ORDER, METHOD)


def test_fits_past_the_bound_are_refused_until_the_queue_drains():
    values = series(30, seed=2)

    async def go(pool):
        got: list = []
        q = FitQueue(pool, ORDER, METHOD, lambda k, p: got.append(k), max_pending=10)
        first = [q.want(i, v) for i, v in enumerate(values[:25])]
        while q.pending:
            await asyncio.sleep(0.01)
        later = [q.want(i, v) for i, v in enumerate(values[25:], 25)]
        while q.pending:
            await asyncio.sleep(0.01)
        return first, later, got

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        first, later, got = asyncio.run(go(pool))
    assert first == [True] * 10 + [False] * 15
    assert later == [True] * 5
    assert sorted(got) == [*range(10), *range(25, 30)]


def test_no_pool_refuses_and_a_failing_pool_gives_every_fit_none(monkeypatch):
    values = series(5, seed=3)
    got, q, accepted = asyncio.run(run_queue(None, values))
    assert accepted == [False] * 5 and got == {} and q.submitted == 0

    closed = concurrent.futures.ThreadPoolExecutor(1)
    closed.shutdown()
    got, q, accepted = asyncio.run(run_queue(closed, values))
    assert all(accepted) and got == {i: [None] for i in range(5)} and q.pending == 0

    calls = []

    def fails_once(vs, order, method):
        calls.append(len(vs))
        if len(calls) == 1:
            raise MemoryError("pool process gone")
        return [arima.fit(v, order, method) for v in vs]

    monkeypatch.setattr(arima, "fit_many", fails_once)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        got, q, accepted = asyncio.run(run_queue(pool, values))
    assert calls == [1, 4]  # the failed job held the first fit alone
    assert got[0] == [None] and all(got[i][0] is not None for i in range(1, 5))


class CountingPool(concurrent.futures.ThreadPoolExecutor):
    """A thread pool that counts the jobs it holds (submitted, not finished) and the most at
    once: what the queue put in it, whatever its threads' timing."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.lock = threading.Lock()
        self.now = self.most = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        fut = super().submit(fn, *args, **kwargs)
        fut.add_done_callback(self._finished)  # before the event loop's, so it counts first
        return fut

    def _finished(self, _fut: concurrent.futures.Future) -> None:
        with self.lock:
            self.now -= 1


@pytest.mark.parametrize("jobs", [1, 3])
def test_jobs_in_flight_are_bounded(jobs):
    values = series(40, seed=4)
    with CountingPool(4) as pool:
        got, q, _ = asyncio.run(run_queue(pool, values, jobs=jobs, max_batch=8))
    assert sorted(got) == list(range(40))
    assert pool.most == jobs  # the pool has 4 threads: only the queue holds it to ``jobs``
    # ``jobs`` lone fits go at once, then the other fits 8 at a time as jobs finish
    assert q.submitted == jobs + -(-(40 - jobs) // 8)
