"""One CPU thread while a judge measures: the exercises' tensors are small, so a thread pool
costs more than it buys, and on a busy machine its threads wait on each other."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def one_thread():
    """Run the block with torch on one CPU thread; the thread count is put back after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
