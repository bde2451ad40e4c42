"""Issue 29, item 5: the Python package admits what it allocates as `eplb run` does (MemAvailable,
/dev/shm free space, a 10% margin) and refuses with eplb.Error before allocating anything. The
limits are simulated (EPLB_TEST_MEMAVAILABLE, EPLB_TEST_SHM_FREE); nothing large is allocated.
"""
import os
import time

import pytest
import torch

import eplb


def shm_bytes() -> int:
    return sum(os.stat(os.path.join("/dev/shm", name)).st_size for name in os.listdir("/dev/shm")
               if os.path.isfile(os.path.join("/dev/shm", name)))


def test_one_tebibyte_is_refused_before_anything_is_allocated():
    before, started = shm_bytes(), time.monotonic()
    with pytest.raises(eplb.Error, match=r"memory admission: agent .*allocating transfer memory of 1 TiB"):
        eplb.empty((2**40,), torch.uint8)
    assert time.monotonic() - started < 2
    assert shm_bytes() <= before


def test_shared_memory_is_admitted_against_dev_shm(monkeypatch):
    monkeypatch.setenv("EPLB_TEST_SHM_FREE", "64MiB")
    with pytest.raises(eplb.Error, match="free in /dev/shm"):
        eplb.empty((64 << 20,), torch.uint8)
    assert eplb.empty((1 << 20,), torch.uint8).numel() == 1 << 20  # small enough: allocated


def test_ram_is_admitted_against_memavailable(monkeypatch):
    monkeypatch.setenv("EPLB_TEST_MEMAVAILABLE", "100MiB")
    with pytest.raises(eplb.Error, match="90% of MemAvailable 100 MiB"):
        eplb.empty((96 << 20,), torch.uint8)


def test_sizes_past_every_machine_are_refused_by_the_cap():
    with pytest.raises(eplb.Error, match="more than the 281474976710656 an allocation may have"):
        eplb.empty((2**40, 2**10), torch.float32)


def test_a_bad_test_hook_is_an_error_not_a_pass(monkeypatch):
    monkeypatch.setenv("EPLB_TEST_MEMAVAILABLE", "plenty")
    with pytest.raises(eplb.Error, match="EPLB_TEST_MEMAVAILABLE"):
        eplb.empty((4096,), torch.uint8)
