"""Threads for the products: how many a forward may ask for, how a matrix is cut into runs, and `Workers`.

`Workers` is a pool of persistent threads owned by one kernel object (no module state). run_count and run_cuts are
the one rule by which every panel kernel shares a matrix out; no bit depends on it. Imports numpy.
"""

import os
import threading
import weakref

import numpy as np

THREADS_PER_CPU = 64  # the most threads a forward may ask for, per CPU this process may use (check_threads)


def check_threads(threads, cpus=None):  # -> int; cpus: default os.sched_getaffinity, else os.cpu_count
    """Raises ValueError unless `threads` is a positive integer of at most THREADS_PER_CPU per CPU (the rule for every
    thread count: --threads, NPSPEC_NUM_THREADS, load(threads=...))."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"the thread count must be a positive integer, got {threads!r}")
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
    if threads > THREADS_PER_CPU * cpus:
        raise ValueError(f"the thread count must be at most {THREADS_PER_CPU * cpus} ({THREADS_PER_CPU} per CPU; this "
                         f"process may use {cpus}), got {threads:,}; a thread per CPU is fastest")
    return int(threads)


def run_count(threads, count, nbytes, split_bytes):  # -> int in [1, min(threads, count)]
    """min(threads, count) runs for a matrix of `split_bytes` or more, else 1 (one call on the calling thread)."""
    return min(threads, count) if nbytes >= split_bytes else 1


def run_cuts(count, threads):  # -> [threads + 1] ints, 0 = cuts[0] <= ... <= cuts[threads] = count
    """Run i of `count` panels cut as evenly as integers allow is [cuts[i], cuts[i + 1])."""
    return [count * i // threads for i in range(threads + 1)]


class Workers:
    """`n` persistent worker threads, each handed one job at a time through a pair of locks.

    Leaner than concurrent.futures.ThreadPoolExecutor (no Future, no queue): a job is a callable
    with no arguments, handed over by releasing the worker's `go` lock; the worker releases its
    `done` lock when the job returns. numpy releases the GIL inside its products, so jobs that are
    products run at the same time. Threads start on first use and are daemons (a worker blocked on
    its lock never keeps the interpreter alive). An exception in a job is raised again in the
    caller of `run`. Interrupting `run` (KeyboardInterrupt) leaves no job half-collected: the next
    `run` first waits for every worker still busy. The threads hold the locks and lists, not the
    Workers object, so once nothing else holds it (a model left behind by with_kernel, a probe's
    candidate) it is collected and its threads end (`stop_workers`).
    """

    def __init__(self, n):
        self.n = n
        self.go = [threading.Lock() for _ in range(n)]
        self.done = [threading.Lock() for _ in range(n)]
        self.jobs, self.errors, self.busy = [None] * n, [None] * n, [False] * n  # changed in place only
        self.threads = []

    def start(self):
        for i in range(self.n):
            self.go[i].acquire()
            self.done[i].acquire()
            t = threading.Thread(target=work, args=(self.go[i], self.done[i], self.jobs, self.errors, i),
                                 name=f"npspec-{i}", daemon=True)
            t.start()
            self.threads.append(t)
        weakref.finalize(self, stop_workers, self.go, self.done, self.jobs, self.busy).atexit = False  # daemons

    def run(self, jobs):
        """Run `jobs` (at most n + 1 callables) at once: jobs[0] on the calling thread, the rest on the workers; wait for all."""
        if not self.threads:
            self.start()
        self.collect()  # a job left running by an interrupted run
        self.errors[:] = [None] * self.n  # and whatever it raised: that run is over
        for i, job in enumerate(jobs[1:]):
            self.jobs[i], self.busy[i] = job, True
            self.go[i].release()
        try:
            jobs[0]()
        finally:
            self.collect()
        if errors := [e for e in self.errors if e is not None]:
            self.errors[:] = [None] * self.n
            raise errors[0]

    def collect(self):
        for i in range(self.n):
            if self.busy[i]:
                self.done[i].acquire()
                self.busy[i] = False


STOP = object()  # the job that ends a worker's thread (stop_workers)


def work(go, done, jobs, errors, i):  # worker i's thread: its two locks, the shared job and error lists
    """Worker i's loop (Workers): wait for `go`, run jobs[i], record what it raised in errors[i], release `done`;
    return at the STOP job."""
    while True:
        go.acquire()
        job = jobs[i]
        if job is STOP:
            return
        try:
            job()
        except BaseException as e:  # raised again in run's thread
            errors[i] = e
        jobs[i] = job = None  # a job holds its kernel (and so this Workers): nothing keeps it while waiting
        done.release()


def stop_workers(go, done, jobs, busy):
    """End every worker's thread (called when its Workers is collected): wait for a job still running, then hand
    each the STOP job."""
    for i in range(len(go)):
        if busy[i]:
            done[i].acquire()
            busy[i] = False
        jobs[i] = STOP
        go[i].release()
