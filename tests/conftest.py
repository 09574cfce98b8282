"""Fixtures several test modules share (the bitwise oracle `same` lives in `oracle.py`)."""
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core box spin and stall."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
