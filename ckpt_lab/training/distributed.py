"""Run a function on several local processes joined in a `torch.distributed` process group.

`launch(fn, *args, world_size=2)` is what `torchrun` does on one machine, small enough to read:
it picks a free TCP port and starts `world_size` fresh Python interpreters (spawned, never
forked); each one sets its rank's environment, joins the process group (gloo on CPU, NCCL when
every rank has its own GPU), calls ``fn(*args)`` and sends the pickled result back over a pipe.
Ranks use one thread each, and gloo ranks see no GPU (they compute on the CPU).

A fresh interpreter cannot see the caller's variables: it receives ``fn`` *by name* (module and
qualified name) and imports it. A function defined in a notebook cell or in a script's
``__main__`` has no module another interpreter can import, so `launch` refuses it up front and
says where to put it (the lesson's own rank functions live in `ckpt_lab.lessons.scale_out`). Why not
fork, which would copy the caller, cell functions included? A forked child inherits the parent's
threads (OpenMP pools, Jupyter's) and any CUDA state half-initialised, and either can hang it;
spawning is the start method that works everywhere. Unlike `multiprocessing`'s spawn, the
children here never re-run the caller's script, so a script needs no ``__main__`` guard.

Whatever happens (a rank raises, a rank hangs past ``timeout``, the caller presses Ctrl-C),
every process `launch` started is ended before it returns or raises, and a failing rank's own
traceback is re-raised in the caller instead of leaving the others waiting in a collective.
If the caller itself dies without a chance to clean up (SIGKILL, a killed or restarted
notebook kernel), its ranks die with it: on Linux each asks the kernel for SIGKILL when its
parent goes (``prctl(PR_SET_PDEATHSIG)``), and on every system each watches its stdin, a pipe
only the caller writes to, and exits when it closes. Their stderr goes to anonymous temporary
files, so no exit path leaves a file behind.

The job (function and arguments) travels pickled, and a rank reads all of it before
unpickling, so a job that fails to unpickle there (an object whose class is defined in a
notebook or a script's ``__main__``) comes back as `RankError` with the rank's own exception
and what to do about it.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
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
    if not callable(fn):
        raise TypeError(f"launch needs a function, got {fn!r}")
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", getattr(fn, "__name__", ""))
    if module in (None, "__main__", "__mp_main__") or "<locals>" in qualname \
            or "<lambda>" in qualname:
        raise ValueError(
            f"launch cannot send {qualname or fn!r} (module {module!r}) to the new processes: "
            "each is a fresh interpreter that imports the function by module and name, and "
            "a function defined in a notebook cell, a script's __main__, a lambda or another "
            "function has no importable name. Put it at the top level of a .py module on the "
            "path (like ckpt_lab.lessons.scale_out) and import it from there.")


UNPICKLE_ADVICE = (
    "The function and its arguments travel pickled to fresh interpreters, which rebuild every "
    "object by importing its class by module and name. An object whose class is defined in a "
    "notebook cell or a script's __main__ cannot be rebuilt there: define the class in a .py "
    "module the ranks can import (on sys.path, like ckpt_lab.training.models) and import it from there.")


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent exits (strictly, when the
    thread that started it does: `launch`'s, which waits for the ranks). The parent may have
    exited before the request (this process was then adopted): leave at once."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass                            # no prctl: the stdin lifeline still holds
    if os.getppid() != parent_pid:
        os._exit(1)


def _watch_lifeline(stream) -> threading.Thread:
    """Every system: a daemon thread reads `stream`, a pipe only the parent writes to, and
    ends this process when the pipe ends (the parent closed it or died)."""
    def watch():
        try:
            while stream.read(1):
                pass
        finally:
            os._exit(1)
    thread = threading.Thread(target=watch, daemon=True, name="ckpt_lab-lifeline")
    thread.start()
    return thread


def _read_exactly(stream, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"the caller's pipe ended after {len(data)} of {n} bytes")
    return data


def _read_message(stream) -> bytes:
    """One length-prefixed message of `_message`."""
    (n,) = struct.unpack("<Q", _read_exactly(stream, 8))
    return _read_exactly(stream, n)


def _message(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _rank_main() -> None:
    """Entry point of each rank (``python -c``): read the job from stdin, run it, send the result."""
    stdin = sys.stdin.buffer
    _die_with_parent(int(sys.argv[2]))
    torch.set_num_threads(1)                # ranks share the cores: one thread each
    out = Connection(int(sys.argv[1]), readable=False)
    rank, joined = int(os.environ["RANK"]), False
    try:
        path, job = _read_message(stdin), _read_message(stdin)   # all of it, then unpickle
        _watch_lifeline(stdin)
        sys.path[:] = pickle.loads(path)    # the caller's path, so fn can be imported
        try:
            fn, args, backend, timeout = pickle.loads(job)
        except Exception as err:            # noqa: BLE001 -- reported with what to do
            raise RuntimeError(f"rank {rank} could not unpickle its job ({len(job):,} bytes): "
                               f"{type(err).__name__}: {err}. {UNPICKLE_ADVICE}") from err
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=datetime.timedelta(seconds=timeout))
        joined = True
        payload = pickle.dumps(("ok", fn(*args)))   # plain pickle: tensors travel as bytes
    except BaseException:                   # noqa: BLE001 -- every failure goes to the caller
        payload = pickle.dumps(("error", traceback.format_exc()))
    out.send_bytes(payload)                 # before leaving the group, which may wait on peers
    out.close()
    if joined:
        dist.destroy_process_group()


def _end(processes, grace: float = 0.0) -> None:
    """Give the processes `grace` seconds to exit, then terminate, kill and reap them all."""
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(3.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _tail(log, chars: int = 3000) -> str:
    """The end of what a rank wrote to stderr (an open, unnamed temporary file)."""
    log.seek(0)
    text = log.read().decode(errors="replace")
    return text[-chars:] if text.strip() else "(nothing on stderr)"


def launch(fn, *args, world_size: int = 2, timeout: float = DEFAULT_TIMEOUT,
           backend: str | None = None) -> list:
    """Call ``fn(*args)`` on `world_size` local processes in one process group; their return
    values, by rank. A rank's exception is re-raised here as `RankError` with its traceback;
    ranks still running after `timeout` seconds are killed (`RankTimeout`)."""
    _check_importable(fn)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    backend = backend or default_backend(world_size)
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"backend='nccl' needs a GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count()} GPUs; use backend='gloo'")
    job = _message(pickle.dumps(list(sys.path))) + _message(
        pickle.dumps((fn, args, backend, timeout)))
    port = free_port()
    processes, readers, logs, finished = [], {}, [], False
    try:
        for rank in range(world_size):
            read_fd, write_fd = os.pipe()
            readers[Connection(read_fd, writable=False)] = rank
            logs.append(tempfile.TemporaryFile("w+b", prefix=f"ckpt_lab-rank{rank}-"))  # no name
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                       OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            if backend != "nccl":
                env["CUDA_VISIBLE_DEVICES"] = ""   # CPU ranks: no CUDA context, no stray GPU
            try:
                processes.append(subprocess.Popen(
                    [sys.executable, "-c", "from ckpt_lab.training.distributed import _rank_main; "
                     "_rank_main()", str(write_fd), str(os.getpid())], stdin=subprocess.PIPE,
                    stderr=logs[-1], pass_fds=(write_fd,), env=env))
            finally:
                os.close(write_fd)          # the child holds the only writing end now
        for p in processes:                 # every rank is starting; now hand each its job
            try:                            # (its stdin stays open: the rank's lifeline)
                p.stdin.write(job)
                p.stdin.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass                        # it died first: its result pipe tells why
        results: dict[int, object] = {}
        deadline = time.monotonic() + timeout
        while readers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RankTimeout(sorted(readers.values()), timeout)
            for read in wait(list(readers), timeout=min(left, 1.0)):
                rank = readers.pop(read)
                try:
                    kind, value = pickle.loads(read.recv_bytes())
                except EOFError:
                    processes[rank].wait(3.0)
                    raise RankError(rank, f"the process died without a result (exit code "
                                          f"{processes[rank].returncode}); its stderr:\n"
                                          f"{_tail(logs[rank])}") from None
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
        for p in processes:
            try:
                p.stdin.close()
            except OSError:
                pass
        for log in logs:
            log.close()


# --------------------------------------------------------------------- inside a rank
def peak_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux VmHWM; current RSS elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import psutil
    return psutil.Process().memory_info().rss
