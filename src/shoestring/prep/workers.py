"""Worker processes for prep: an order-preserving, bounded parallel map, and the work itself.

Output must not depend on the number of workers, so results are consumed strictly in
submission order (a slow batch holds back later ones rather than letting them overtake it).
At most ``ahead`` batches are in flight, so memory stays bounded however long the input is
(``multiprocessing.Pool.imap`` would read the whole input into its task queue).

On Linux workers are forked (started at once, before prep starts its progress threads):
spawning would re-import the caller's ``__main__``, which breaks scripts without a
``__main__`` guard and ``python -`` (stdin) sessions. Each worker runs `tokenizers`
single-threaded (``TOKENIZERS_PARALLELISM=false``), which is also what keeps a forked child
of a process whose `tokenizers` thread pool already ran from deadlocking. Elsewhere workers
are spawned.

Workers die with prep (`die_with_parent`): a worker waits on a task pipe whose write end its
siblings hold too, so when prep is killed (``kill -9``, the OOM killer) nothing closes it and
the worker would wait forever, holding its memory (issue 62: a 142 MB worker seen 44 minutes
later).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np

from shoestring.prep.clean import clean_text

T = TypeVar("T")
R = TypeVar("R")


class WorkerPool:
    """``workers`` processes (or none: with 1 worker everything runs inline)."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._pool: Any = None

    def start(self) -> WorkerPool:
        """Start the worker processes now (with 1 worker: nothing to start)."""
        if self.workers > 1:
            self._get()
        return self

    def _get(self) -> Any:
        if self._pool is None:
            method = "fork" if sys.platform == "linux" else "spawn"
            ctx = multiprocessing.get_context(method)
            # Set while forking, so `tokenizers` in the child starts single-threaded (and does
            # not warn that it had to disable the parent's thread pool).
            saved = os.environ.get(_PARALLELISM)
            os.environ[_PARALLELISM] = "false"
            try:
                self._pool = ctx.Pool(self.workers, initializer=init_worker,
                                      initargs=(os.getpid(),))
            finally:
                if saved is None:
                    del os.environ[_PARALLELISM]
                else:
                    os.environ[_PARALLELISM] = saved
        return self._pool

    def map(self, fn: Callable[..., R], items: Iterable[Any], *args: Any) -> Iterator[R]:
        """``fn(item, *args)`` for each item, in order; parallel when workers > 1."""
        if self.workers <= 1:
            for item in items:
                yield fn(item, *args)
            return
        pool = self._get()
        pending: deque = deque()
        ahead = 2 * self.workers
        for item in items:
            pending.append(pool.apply_async(fn, (item, *args)))
            if len(pending) >= ahead:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_PARALLELISM = "TOKENIZERS_PARALLELISM"


def init_worker(parent: int | None = None) -> None:
    """One thread per worker: the workers are the parallelism (no oversubscription). A
    pool's worker dies with ``parent`` (prep); a Ray task's process (no ``parent``) is Ray's
    to manage."""
    os.environ[_PARALLELISM] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    if parent is not None:
        die_with_parent(parent)


PARENT_POLL_SECONDS = 1.0  # where the kernel cannot be asked: how often a worker looks


def die_with_parent(parent: int) -> None:
    """End this worker process soon after ``parent`` (the pid that started it) dies.

    On Linux the kernel sends SIGKILL the moment the parent goes (``prctl(PR_SET_DEATHSIG)``;
    SIGKILL, because a forked worker inherits prep's Python signal handlers and holds nothing
    worth cleaning up: its results were for the parent). Elsewhere, or if prctl fails, a
    daemon thread polls the parent pid every `PARENT_POLL_SECONDS`. Either way, a parent that
    died before this ran is caught by the pid check. Meant for a pool initializer."""
    if not _kernel_death_signal():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                         name="shoestring-parent-watch").start()
    if os.getppid() != parent:  # gone already (before the signal was armed)
        os._exit(1)


def _kernel_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where that is not
    available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_SECONDS)
    os._exit(1)


def batched(items: Iterable[T], size: int, max_chars: int | None = None) -> Iterator[list[T]]:
    """Lists of up to ``size`` items, and (for strings) up to about ``max_chars`` characters:
    a batch of long documents is cut early, so memory does not depend on document lengths."""
    batch: list[T] = []
    chars = 0
    for item in items:
        batch.append(item)
        if max_chars is not None:
            chars += len(item)  # type: ignore[arg-type]
        if len(batch) == size or (max_chars is not None and chars >= max_chars):
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# --- the work --------------------------------------------------------------------------


def clean_texts(texts: list[str]) -> list[str]:
    return [clean_text(t) for t in texts]


_TOKENIZERS: dict[str, Any] = {}


def encode_texts(texts: list[str], tokenizer: Any, sep_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts``, each followed by ``sep_id``, as one uint32 array; and the number
    of tokens of each text (without the separator).

    ``tokenizer`` is a `tokenizers.Tokenizer` (inline) or the path of its JSON (in a worker,
    loaded once per process).
    """
    if isinstance(tokenizer, str):
        if tokenizer not in _TOKENIZERS:
            from tokenizers import Tokenizer

            _TOKENIZERS.clear()
            _TOKENIZERS[tokenizer] = Tokenizer.from_file(tokenizer)
        tokenizer = _TOKENIZERS[tokenizer]
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False) if hasattr(
        tokenizer, "encode_batch_fast") else tokenizer.encode_batch(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(texts))
    flat: list[int] = []
    for enc in encodings:
        flat.extend(enc.ids)
        flat.append(sep_id)
    return np.array(flat, dtype=np.uint32), lengths
