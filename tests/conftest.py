"""What several test modules share: fixtures, and `same`, the bitwise comparison of gradient
lists (test modules import it: ``from conftest import same``)."""
import pytest
import torch


def same(a, b) -> bool:
    """Two lists of tensors (or None) equal element by element, bit for bit."""
    return len(a) == len(b) and all(
        (u is None and v is None) or (u is not None and v is not None and torch.equal(u, v))
        for u, v in zip(a, b))


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one thread; two threads on a busy 2-core box spin and stall."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
