"""`release_freed_memory`: the pages a finished step freed go back to the system (glibc), between the loop's and
the demo's steps."""

from __future__ import annotations

import ctypes.util
import threading

import psutil
import pytest

from agentic_retriever.app import demo
from agentic_retriever.base.memory_release import release_freed_memory

glibc = pytest.mark.skipif(not ctypes.util.find_library("c") or not hasattr(ctypes.CDLL(ctypes.util.find_library("c")),
                                                                          "malloc_trim"), reason="glibc's malloc_trim")


def fragment_a_thread_arena(megabytes: int) -> tuple[list[int], ctypes.CDLL, int, int]:
    """Allocate `megabytes` in 64 KiB pieces with C's malloc from a new thread (a glibc arena of its own, or one an
    earlier thread left) and free every other piece: each freed page sits between live blocks, which glibc does not
    give back by itself (as a step's freed tensors sit between what the step's threads still hold). Returns the
    pieces still allocated, libc, and the process's RSS once every piece was touched and once half was freed."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    kept, rss = [], []

    def work():
        pieces = [libc.malloc(64 * 1024) for _ in range(megabytes * 16)]
        for piece in pieces:
            ctypes.memset(piece, 1, 64 * 1024)  # touched: resident
        rss.append(psutil.Process().memory_info().rss)
        for piece in pieces[::2]:
            libc.free(piece)
        rss.append(psutil.Process().memory_info().rss)
        kept.extend(pieces[1::2])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return kept, libc, *rss


@glibc
def test_memory_freed_by_a_finished_step_goes_back_to_the_system():
    process = psutil.Process()
    kept, libc, touched, held = fragment_a_thread_arena(512)
    # measured against the process's own RSS at each point, not a baseline: in a process that ran other work, the
    # thread may reuse an arena whose freed pages were already resident
    assert held > touched - 64 * 2**20, "glibc kept the freed half (what the loop process met)"
    assert release_freed_memory() is True
    assert process.memory_info().rss < held - 192 * 2**20, "the freed half went back to the system"
    for piece in kept:
        libc.free(piece)


def test_the_demo_releases_memory_after_each_step_even_one_that_fails(monkeypatch):
    calls = []
    monkeypatch.setattr(demo, "release_freed_memory", lambda: calls.append("released"))
    steps = demo.Steps(total=2)
    assert steps.run("first", lambda: 7) == 7 and calls == ["released"]

    def failing():
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        steps.run("second", failing)
    assert calls == ["released", "released"]
