"""`distributed.launch`: return values by rank, a failing rank's traceback, a hanging rank
killed at the timeout, and no process left behind in any case."""
import os
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from ckpt_lab import distributed


def _children() -> set[int]:
    """The process ids of every process below this one."""
    return {c.pid for c in psutil.Process().children(recursive=True)}


# rank functions: top level of an importable module, as spawn requires
def rank_sum(scale):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), scale * t.item(), torch.get_num_threads(), \
        os.getpid()


def rank_one_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank one is broken on purpose")
    dist.barrier()          # rank 0 would wait here forever without launch's cleanup


def rank_one_hangs():
    if dist.get_rank() == 1:
        time.sleep(600)
    return dist.get_rank()


def test_return_values_by_rank_and_one_thread_each():
    before = _children()
    out = distributed.launch(rank_sum, 10.0, world_size=2, timeout=60)
    assert [o[:3] for o in out] == [(0, 2, 30.0), (1, 2, 30.0)]
    assert all(o[3] == 1 for o in out)
    assert all(o[4] != os.getpid() for o in out) and out[0][4] != out[1][4]
    assert _children() == before
    assert not any(psutil.pid_exists(o[4]) and psutil.Process(o[4]).status() != "zombie"
                   for o in out)


def test_a_rank_that_raises_is_reraised_with_its_traceback():
    before = _children()
    start = time.monotonic()
    with pytest.raises(distributed.RankError) as info:
        distributed.launch(rank_one_raises, world_size=2, timeout=60)
    assert info.value.rank == 1
    assert "rank one is broken on purpose" in str(info.value)
    assert "rank_one_raises" in info.value.remote_traceback      # the rank's own frames
    assert time.monotonic() - start < 45                          # rank 0 was not waited for
    assert _children() == before


def test_a_rank_that_hangs_is_killed_at_the_timeout():
    before = _children()
    start = time.monotonic()
    with pytest.raises(distributed.RankTimeout) as info:
        distributed.launch(rank_one_hangs, world_size=2, timeout=12)
    assert 1 in info.value.ranks      # (rank 0 too, if a busy machine kept it from starting)
    assert "did not finish within 12 s" in str(info.value)
    assert time.monotonic() - start < 12 + 15
    assert _children() == before


def test_functions_spawn_cannot_import_are_refused_with_advice():
    def local(x):
        return x
    for fn in (local, lambda: 0):
        with pytest.raises(ValueError, match="importable"):
            distributed.launch(fn)
    with pytest.raises(ValueError, match="world_size"):
        distributed.launch(rank_sum, 1.0, world_size=0)


def test_ctrl_c_in_the_caller_ends_every_rank():
    import _thread
    import threading
    before = _children()
    timer = threading.Timer(6.0, _thread.interrupt_main)     # what Ctrl-C / Jupyter's stop does
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            distributed.launch(rank_one_hangs, world_size=2, timeout=60)
    finally:
        timer.cancel()
    assert _children() == before


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a GPU per rank")
def test_nccl_with_a_gpu_per_rank():
    from ckpt_lab.lessons import scale_out
    out = distributed.launch(scale_out.whoami, world_size=2, timeout=120)
    assert [o["backend"] for o in out] == ["nccl", "nccl"]
    assert [o["device"] for o in out] == ["cuda:0", "cuda:1"]
    assert all(o["sum_of_ranks"] == 1 for o in out)


def test_gloo_ranks_see_no_gpu():
    from ckpt_lab.lessons import scale_out
    out = distributed.launch(scale_out.whoami, world_size=2, backend="gloo", timeout=60)
    assert [o["device"] for o in out] == ["cpu", "cpu"] and out[0]["backend"] == "gloo"


def test_a_script_needs_no_main_guard(tmp_path):
    """Ranks import fn by name and never re-run the caller's script."""
    import subprocess
    import sys
    script = tmp_path / "job.py"
    script.write_text("from ckpt_lab import distributed\nfrom ckpt_lab.lessons import scale_out\n"
                      "print([r['rank'] for r in distributed.launch(scale_out.whoami)])\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[0, 1]"
