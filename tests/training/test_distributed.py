"""`distributed.launch`: return values by rank, a failing rank's traceback, a hanging rank
killed at the timeout, a job that cannot be unpickled, a parent killed hard, and no process
or file left behind in any case."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def rank_ready_then_sleeps(directory):
    """Say this rank is running (its pid in a file, written whole), then sleep."""
    path = Path(directory, f"rank{dist.get_rank()}.pid")
    Path(f"{path}.part").write_text(str(os.getpid()))
    os.replace(f"{path}.part", path)
    time.sleep(600)


def rank_len(obj):
    return len(obj)


class NotebookModel:
    """Stands for a class defined in a notebook cell: pickled as __main__.NotebookModel."""

    def __init__(self, nbytes):
        self.weights = bytes(nbytes)

    def __len__(self):
        return len(self.weights)


def _gone(proc: psutil.Process) -> bool:
    """Ended (a zombie counts: it runs nothing, and whoever adopted it reaps it)."""
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


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
    with pytest.raises(distributed.RankError) as info:
        distributed.launch(rank_one_raises, world_size=2, timeout=600)
    assert info.value.rank == 1
    assert "rank one is broken on purpose" in str(info.value)
    assert "rank_one_raises" in info.value.remote_traceback      # the rank's own frames
    # rank 0 was not waited for: its barrier would have ended only in a RankTimeout
    assert not isinstance(info.value, distributed.RankTimeout)
    assert _children() == before


def test_a_rank_that_hangs_is_killed_at_the_timeout():
    before = _children()
    with pytest.raises(distributed.RankTimeout) as info:   # rank 1 would sleep 600 s
        distributed.launch(rank_one_hangs, world_size=2, timeout=12)
    assert 1 in info.value.ranks      # (rank 0 too, if a busy machine kept it from starting)
    assert "did not finish within 12 s" in str(info.value)
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


def test_ranks_die_with_a_parent_killed_hard_and_leave_no_files(tmp_path):
    """SIGKILL the caller (what a killed or restarted notebook kernel gets): no cleanup code
    runs there, yet every rank ends within seconds and no log file is left behind."""
    ready, scratch = tmp_path / "ready", tmp_path / "tmp"
    ready.mkdir()
    scratch.mkdir()
    script = (f"import sys\nsys.path[:] = {sys.path!r}\n"
              "from ckpt_lab import distributed\n"
              f"from {rank_ready_then_sleeps.__module__} import rank_ready_then_sleeps\n"
              f"distributed.launch(rank_ready_then_sleeps, {str(ready)!r}, world_size=2, "
              "timeout=600)\n")
    with open(tmp_path / "parent.err", "wb") as err:
        parent = subprocess.Popen([sys.executable, "-c", script], stderr=err,
                                  env=dict(os.environ, TMPDIR=str(scratch)))
    ranks = []
    try:
        started = _wait_until(lambda: len(list(ready.glob("*.pid"))) == 2
                              or parent.poll() is not None, 120)
        assert started and parent.poll() is None, (tmp_path / "parent.err").read_text()[-3000:]
        ranks = [psutil.Process(int(f.read_text())) for f in ready.glob("*.pid")]
        assert [r.ppid() for r in ranks] == [parent.pid] * 2
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        assert _wait_until(lambda: all(_gone(r) for r in ranks), 15), \
            [r.pid for r in ranks if not _gone(r)]
        assert list(scratch.iterdir()) == []        # the ranks' stderr had no file name
    finally:                                        # end whatever this test started
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for r in ranks:
            if not _gone(r):
                r.kill()


@pytest.mark.parametrize("how", ["parent gone before the rank asked", "lifeline closed"])
def test_a_rank_leaves_when_its_parent_is_already_gone_or_its_lifeline_ends(how):
    """The race (the parent dies before the rank's prctl) and the pipe every system has."""
    code = ("import sys, time\nfrom ckpt_lab import distributed\n"
            + ("distributed._die_with_parent(1)\n" if how.startswith("parent") else
               "distributed._watch_lifeline(sys.stdin.buffer)\nprint('watching', flush=True)\n")
            + "time.sleep(60)\nprint('still here')\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        if how == "lifeline closed":
            assert child.stdout.readline().strip() == "watching"
            child.stdin.close()
        assert child.wait(30) == 1
        assert "still here" not in child.stdout.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_job_that_cannot_be_unpickled_names_the_ranks_error_and_the_fix(monkeypatch):
    # A class defined in a notebook pickles by reference to __main__, which a rank (a fresh
    # interpreter) does not have. Over 64 KB, the pipe would fill before the rank fails.
    before = _children()
    NotebookModel.__module__ = "__main__"
    monkeypatch.setattr(sys.modules["__main__"], "NotebookModel", NotebookModel, raising=False)
    try:
        with pytest.raises(distributed.RankError) as info:
            distributed.launch(rank_len, NotebookModel(200_000), world_size=2, timeout=60)
    finally:
        NotebookModel.__module__ = __name__
    message = str(info.value)
    assert "could not unpickle its job" in message
    assert "Can't get attribute 'NotebookModel'" in message       # the rank's own error
    assert "define the class in a .py module" in message          # and what to do
    assert not isinstance(info.value.__context__, BrokenPipeError)
    assert _children() == before
    # the same object from an importable class travels fine
    assert distributed.launch(rank_len, NotebookModel(200_000), world_size=2,
                              timeout=60) == [200_000, 200_000]

