"""Policies from several Python threads: the same results, the GIL released while a policy runs."""
import os
import threading
import time

import numpy as np
import pytest

import eplb

COUNTS = (288, 8, 4, 32)  # DeepSeek-V3's serving shape


def long_load(layers, seed):
    return np.random.default_rng(seed).zipf(1.4, size=(layers, 256)).clip(max=10 ** 6).astype(np.float64)


def test_another_thread_runs_while_a_policy_runs():
    """A Python thread keeps counting through the middle of one long policy call.

    If the call held the GIL, the counting thread could not run at all between the call's start and
    end (the array conversions before and after take well under 1% of the call).
    """
    layers = 3000  # about 0.2 s in the C++ policy on this project's machines; doubled where faster
    while True:
        load = long_load(layers, seed=1)
        ticks, stop = [], threading.Event()

        def count():
            while not stop.is_set():
                ticks.append(time.perf_counter())

        counter = threading.Thread(target=count)
        counter.start()
        time.sleep(0.02)
        start = time.perf_counter()
        eplb.rebalance_experts(load, *COUNTS)
        end = time.perf_counter()
        stop.set()
        counter.join()
        if end - start > 0.1 or layers >= 48000:
            break
        layers *= 2
    quarter = (end - start) / 4
    middle = [t for t in ticks if start + quarter < t < end - quarter]
    assert end - start > 0.05, f"the call was too short to tell even with {layers} layers"
    assert len(middle) > 100, f"{len(middle)} ticks of the other thread in the middle half of a {end - start:.3f} s call"


def run_in_threads(loads, repeats):
    """(wall seconds, CPU seconds of the process, results) of one thread per load, all at once."""
    results, failures = {}, []

    def work(index):
        try:
            for _ in range(repeats):
                results[index] = eplb.rebalance_experts(loads[index], *COUNTS)
        except Exception as failure:  # reported below, never swallowed
            failures.append(failure)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(loads))]
    start, cpu_start = time.perf_counter(), time.process_time()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    return time.perf_counter() - start, time.process_time() - cpu_start, results


def run_one_at_a_time(loads, repeats):
    start = time.perf_counter()
    results = {}
    for index, load in enumerate(loads):
        for _ in range(repeats):
            results[index] = eplb.rebalance_experts(load, *COUNTS)
    return time.perf_counter() - start, results


def test_four_threads_give_the_same_results():
    """4 threads calling policies at once (several policies, threads=2 inside too) get the sequential results."""
    loads = [long_load(60, seed=20 + i) for i in range(4)]
    policies = ["deepseek", "relabel", "incremental", "balanced"]
    expected = [eplb.rebalance_experts(load, *COUNTS, policy=policy, threads=2) for load, policy in zip(loads, policies)]
    results, failures = {}, []

    def work(index):
        try:
            for _ in range(3):
                results[index] = eplb.rebalance_experts(loads[index], *COUNTS, policy=policies[index], threads=2)
                for got, want in zip(results[index], expected[index]):
                    assert np.array_equal(got, want)
        except Exception as failure:  # reported below, never swallowed
            failures.append(failure)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert sorted(results) == [0, 1, 2, 3]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="running faster in parallel needs 2 cores")
def test_four_threads_run_faster_than_one_at_a_time():
    """4 threads at once: results equal one-at-a-time; wall time below one-at-a-time's.

    Up to 8 rounds; the first whose ratio is below 0.9 passes (with the GIL held no round goes below
    1.0, measured 1.0-1.1; on 2 idle cores it is about 0.55). A machine whose cores are busy with
    other work cannot show a speedup: when no round got even 1.3 cores of CPU time for this process
    while its 4 threads ran, the test is skipped with the numbers (it fails when the process did get
    the cores and still no round was faster). test_another_thread_runs_while_a_policy_runs proves
    the GIL release on any machine; bench/python_policy.py reports the speedup with medians.
    """
    loads = [long_load(800, seed=10 + i) for i in range(4)]
    ratios, cores = [], []
    for _ in range(8):
        alone, expected = run_one_at_a_time(loads, repeats=2)
        together, cpu, results = run_in_threads(loads, repeats=2)
        for index in range(len(loads)):
            for got, want in zip(results[index], expected[index]):
                assert np.array_equal(got, want)
        ratios.append(round(together / alone, 2))
        cores.append(round(cpu / together, 2))
        if ratios[-1] < 0.9:
            return
    numbers = f"4 threads took {ratios} of the one-at-a-time time, using {cores} cores of CPU"
    if max(cores) < 1.3:
        pytest.skip(f"the machine is busy, no second core to measure with: {numbers}")
    pytest.fail(numbers)


def test_results_outlive_later_calls():
    """Result arrays share one block per call (huge pages, output.cpp); released blocks are reused.

    Results kept by the caller (numpy arrays, torch tensors made from them, views) must never be
    overwritten by later calls, whatever is dropped in between.
    """
    import torch

    loads = [long_load(58, seed=30 + i) for i in range(6)]
    expected = [tuple(np.copy(a) for a in eplb.rebalance_experts(load, *COUNTS)) for load in loads]
    kept = {}
    for round_ in range(3):
        for index, load in enumerate(loads):
            result = eplb.rebalance_experts(torch.from_numpy(load) if index % 2 else load, *COUNTS)
            if (index + round_) % 3 == 0:
                kept[(round_, index)] = (result[1][5], result[0])  # a view of log2phy, and phy2log
            del result
    for (round_, index), (log2phy_row, phy2log) in kept.items():
        assert np.array_equal(np.asarray(log2phy_row), expected[index][1][5])
        assert np.array_equal(np.asarray(phy2log), expected[index][0])
