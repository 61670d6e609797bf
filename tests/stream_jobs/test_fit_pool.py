"""The worker's fit pool after one of its processes died: started again at the next job (a
plain process pool refuses every job after that), not more often than its cool-down."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os

import pytest

from steplens.stream_jobs.worker.fit_pool import FitPool

WAIT_S = 120  # a spawned process starts in well under a second; a loaded machine is slower


def processes() -> concurrent.futures.ProcessPoolExecutor:
    spawn = multiprocessing.get_context("spawn")
    return concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn)


def kill_a_process(pool: concurrent.futures.Executor) -> None:
    with pytest.raises(concurrent.futures.BrokenExecutor):
        pool.submit(os._exit, 1).result(WAIT_S)


def test_a_pool_whose_process_died_is_started_again_at_the_next_job():
    started: list[int] = []
    pool = FitPool(processes, restart_every_s=0.0, on_restart=lambda: started.append(1))
    try:
        assert pool.submit(pow, 2, 10).result(WAIT_S) == 1024
        kill_a_process(pool)
        assert pool.submit(pow, 3, 4).result(WAIT_S) == 81
        assert pool.restarts == 1 and started == [1]

        async def through_the_loop() -> int:  # as the worker submits: run_in_executor
            return await asyncio.get_running_loop().run_in_executor(pool, pow, 2, 5)

        assert asyncio.run(through_the_loop()) == 32
    finally:
        pool.shutdown(wait=True)


def test_a_pool_that_broke_again_within_its_cool_down_refuses_the_job():
    pool = FitPool(processes, restart_every_s=3600.0)
    try:
        kill_a_process(pool)
        assert pool.submit(pow, 2, 2).result(WAIT_S) == 4  # the first time: at once
        kill_a_process(pool)
        with pytest.raises(concurrent.futures.BrokenExecutor):
            pool.submit(pow, 2, 2)
        assert pool.restarts == 1
    finally:
        pool.shutdown(wait=True)


def test_a_plain_process_pool_stays_broken():
    """Why the fit pool exists: the standard library's pool refuses every later job."""
    pool = processes()
    try:
        kill_a_process(pool)
        with pytest.raises(concurrent.futures.BrokenExecutor):
            pool.submit(pow, 2, 2)
    finally:
        pool.shutdown(wait=True)
