"""Run a function on several local processes joined in a `torch.distributed` process group.

`launch(fn, *args, world_size=2)` is what `torchrun` does for one machine, small enough to read:
it picks a free TCP port, starts `world_size` processes with the *spawn* start method, and in
each one sets the rank's environment, joins the process group (gloo on CPU, NCCL when every
rank has its own GPU), calls ``fn(*args)`` and sends the pickled result back over a pipe.

Spawn starts a fresh Python interpreter, so the child cannot see the caller's variables: it
receives ``fn`` *by name* (module and qualified name) and imports it. A function defined in a
notebook cell or in a script's ``__main__`` has no module another interpreter can import, so
`launch` refuses it up front and says where to put it (the lesson's own rank functions live in
`ckpt_lab.scale_out`). Spawn rather than fork because a forked child inherits the parent's
threads and CUDA state half-initialised; spawn is the one start method that works everywhere.

Whatever happens (a rank raises, a rank hangs past ``timeout``, the caller presses Ctrl-C),
every process `launch` started is ended before it returns or raises, and a failing rank's own
traceback is re-raised in the caller instead of leaving the others waiting in a collective.
"""
from __future__ import annotations

import datetime
import os
import pickle
import socket
import time
import traceback
from multiprocessing import connection, get_context
from pathlib import Path

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT = 120.0


class RankError(RuntimeError):
    """A rank raised; the message holds that rank's own traceback."""

    def __init__(self, rank: int, remote_traceback: str):
        self.rank, self.remote_traceback = rank, remote_traceback
        super().__init__(f"rank {rank} raised:\n{remote_traceback}")


class RankTimeout(TimeoutError):
    """Some ranks did not finish within the timeout; they were killed."""

    def __init__(self, ranks: list[int], timeout: float):
        self.ranks, self.timeout = ranks, timeout
        super().__init__(f"rank(s) {ranks} did not finish within {timeout:g} s and were killed "
                         "(a rank waiting in a collective its peers never reach hangs; raise "
                         "timeout= if the work is simply slow)")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_backend(world_size: int) -> str:
    """NCCL when every rank can have its own GPU, gloo otherwise."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= world_size \
            and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def _check_importable(fn):
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", ""))
    if not callable(fn):
        raise TypeError(f"launch needs a function, got {fn!r}")
    if module in (None, "__main__", "__mp_main__") or "<locals>" in qualname \
            or "<lambda>" in qualname:
        raise ValueError(
            f"launch cannot send {qualname or fn!r} (module {module!r}) to the new processes: "
            "spawn starts fresh interpreters that import the function by module and name, and "
            "a function defined in a notebook cell, a script's __main__, a lambda or another "
            "function has no importable name. Put it at the top level of a .py module on the "
            "path (like ckpt_lab.scale_out) and import it from there.")


def _worker(rank: int, world_size: int, port: int, backend: str, timeout: float, fn, args,
            conn) -> None:
    """Runs in each child: join the group, call fn, send ("ok", result) or ("error", traceback)."""
    torch.set_num_threads(1)                # ranks share the cores: one thread each
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    joined = False
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout))
        joined = True
        payload = pickle.dumps(("ok", fn(*args)))   # plain pickle: tensors travel as bytes
    except BaseException:                   # noqa: BLE001 -- every failure goes to the caller
        payload = pickle.dumps(("error", traceback.format_exc()))
    conn.send_bytes(payload)                # before leaving the group, which may wait on peers
    conn.close()
    if joined:
        dist.destroy_process_group()


def _end(processes, grace: float = 0.0) -> None:
    """Give the processes `grace` seconds to exit, then terminate, kill and reap them all."""
    deadline = time.monotonic() + grace
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def launch(fn, *args, world_size: int = 2, timeout: float = DEFAULT_TIMEOUT,
           backend: str | None = None) -> list:
    """Call ``fn(*args)`` on `world_size` local processes in one process group; their return
    values, by rank. A rank's exception is re-raised here as `RankError` with its traceback;
    ranks still running after `timeout` seconds are killed (`RankTimeout`)."""
    _check_importable(fn)
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    backend = backend or default_backend(world_size)
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs a GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs; use backend='gloo'")
    ctx = get_context("spawn")
    port = free_port()
    processes, readers, finished = [], {}, False
    try:
        for rank in range(world_size):
            read, write = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, name=f"ckpt_lab-rank{rank}", daemon=True,
                            args=(rank, world_size, port, backend, timeout, fn, args, write))
            p.start()
            write.close()                    # the child holds the only writing end now
            processes.append(p)
            readers[read] = rank
        results: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankTimeout(sorted(readers.values()), timeout)
            for read in connection.wait(list(readers), timeout=min(left, 1.0)):
                rank = readers.pop(read)
                try:
                    kind, value = pickle.loads(read.recv_bytes())
                except EOFError:
                    processes[rank].join(1.0)
                    raise RankError(rank, f"the process died without a result (exit code "
                                          f"{processes[rank].exitcode})") from None
                finally:
                    read.close()
                if kind == "error":
                    raise RankError(rank, value)
                results[rank] = value
        finished = True
        return [results[r] for r in range(world_size)]
    finally:
        for read in readers:
            read.close()
        _end(processes, grace=5.0 if finished else 0.0)


# --------------------------------------------------------------------- inside a rank
def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The number of ranks (1 outside a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux VmHWM; current RSS elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import psutil
    return psutil.Process().memory_info().rss
