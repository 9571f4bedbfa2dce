# SPDX-License-Identifier: MIT
"""The Python binding's bank step against raw ctypes (`make python-bench`).

One decode step of a bank in the steady state (every head holding its
budget, one victim a head): Bank.step(pos, attn) then Bank.evict(budget)
through the binding, against the floor, the same two library calls made
through ctypes with every buffer prepared beforehand (kve_bank_step and
kve_bank_evict, the arguments declared as the binding declares them).
Both run the same library code on the same rows and the same bank (the
floor steps the binding's bank through its handle, so both find the same
memory in the same caches); the difference is what the binding adds per
call (argument checks, the victims arrays, one kve_bank_sizes call). The
bank is warmed to the steady state first; the rounds alternate between
the two so load drifts hit both. The
figure is the ratio of the medians of the per-round means (binding /
floor): machine-dependent, never asserted by a test. docs/python.md
quotes it with the conditions of the run.

    /usr/bin/python3 bench/python_bank.py [--heads 256] [--budget 1024]
                                          [--rounds 15] [--steps 200]
"""
import argparse
import ctypes
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

import numpy as np  # noqa: E402

import kvevict  # noqa: E402
from kvevict import _lib  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=256)
    ap.add_argument("--budget", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=200, help="steps a round, each side")
    ap.add_argument("--spec", default="h2o")
    a = ap.parse_args()
    H, B = a.heads, a.budget
    spec = f"{a.spec}:budget={B}"
    lib = _lib.lib
    rows = np.full((H, B + 1), 1.0 / (B + 1), dtype=np.float32)

    bank = kvevict.Bank(spec, H)
    # the floor: raw ctypes on the same bank, buffers made once
    raw = bank._h
    rows_ptr = rows.ctypes.data
    victims = np.empty(H, dtype=np.int32)
    counts = np.empty(H, dtype=np.uintp)
    vptr, cptr = victims.ctypes.data, counts.ctypes.data
    step, evict = lib.kve_bank_step, lib.kve_bank_evict

    pos = [0]  # the next position: both sides step one sequence

    def run_binding(n):
        p = pos[0]
        t0 = time.perf_counter()
        for i in range(p, p + n):
            bank.step(i, rows)
            bank.evict(B)
        t1 = time.perf_counter()
        pos[0] = p + n
        return (t1 - t0) / n

    def run_raw(n):
        p = pos[0]
        t0 = time.perf_counter()
        for i in range(p, p + n):
            if step(raw, i, rows_ptr, B + 1) != 0 or evict(raw, B, vptr, 1, cptr) != 0:
                sys.exit(f"raw ctypes: {lib.kve_last_error().decode()}")
        t1 = time.perf_counter()
        pos[0] = p + n
        return (t1 - t0) / n

    run_binding(B + 10)  # fill to the budget: the steady state from here on
    ours, floor = [], []
    for _ in range(a.rounds):
        ours.append(run_binding(a.steps))
        floor.append(run_raw(a.steps))
    mb, mr = statistics.median(ours), statistics.median(floor)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"bank step + evict, {spec}, {H} heads x {B} kept, {a.rounds} rounds of {a.steps} "
          f"steps (load average {load:.1f}, {os.cpu_count()} CPUs, {kvevict.isa()})")
    print(f"  raw ctypes (floor)  {mr * 1e6:9.1f} us a step")
    print(f"  kvevict.Bank        {mb * 1e6:9.1f} us a step")
    print(f"  ratio               {mb / mr:9.3f} (binding / floor; target <= 1.2)")


if __name__ == "__main__":
    main()
