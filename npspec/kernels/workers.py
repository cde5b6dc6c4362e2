"""Threads for the products: how many a forward may ask for, how a matrix is cut into runs, and `Workers`.

`Workers` is a pool of persistent threads owned by one kernel object (no module state). run_count and run_cuts are
the one rule by which every panel kernel shares a matrix out; no bit depends on it. Imports numpy.
"""

import os
import queue
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
    """`n` daemon threads that take jobs (callables) from one queue and put (the run's mark, what the job raised or
    None) on another; numpy releases the GIL in its products, so product jobs run at once. `run` raises a job's
    exception again in its caller. Interrupt-safe by construction: every step shared with the workers is one
    queue.SimpleQueue put or get, which a KeyboardInterrupt cannot split, and run's bookkeeping lives in its frame;
    an interrupted run's jobs finish into their own mark and later runs skip them, so nothing waits for a job that
    never started. The threads hold the queues, not the Workers, so an unused Workers is collected (stop_workers).
    """

    def __init__(self, n):
        self.n = n
        self.jobs, self.results = queue.SimpleQueue(), queue.SimpleQueue()  # (mark, job), (mark, error or None)
        self.threads = []
        weakref.finalize(self, stop_workers, self.jobs).atexit = False  # daemons: nothing to do at exit

    def start(self):
        """Start the threads not started yet (a start an interrupt cut short is finished by the next run)."""
        for i in range(len(self.threads), self.n):
            t = threading.Thread(target=work, args=(self.jobs, self.results), name=f"npspec-{i}", daemon=True)
            t.start()
            self.threads.append(t)  # (interrupted before this line: one thread more, which serves the same queues)

    def run(self, jobs):
        """Run `jobs` (at most n + 1 callables) at once: jobs[0] on the calling thread, the rest on the workers; wait for all."""
        if len(self.threads) < self.n:
            self.start()
        mark = object()  # this run's: on each of its jobs and their results
        for job in jobs[1:]:
            self.jobs.put((mark, job))
        try:
            jobs[0]()
        finally:
            errors = self.collect(mark, len(jobs) - 1)
        if errors:
            raise errors[0]

    def collect(self, mark, count):  # -> [the errors the run's jobs raised]
        """Wait for the `count` results of the run marked `mark`; drop the results of runs interrupted before."""
        errors = []
        while count:
            run, error = self.results.get()
            if run is mark:
                count -= 1
                if error is not None:
                    errors.append(error)
        return errors


STOP = object()  # the job that ends the workers' threads (stop_workers)


def work(jobs, results):  # a worker's thread: the queues of (mark, job) and (mark, error or None)
    """A worker's loop (Workers): take a job, run it, put its run's mark and what it raised (None); at STOP, put STOP
    back for the next worker and return."""
    while (item := jobs.get()) is not STOP:
        results.put((item[0], attempt(item[1])))
        item = None  # a job holds its kernel (and so its Workers): nothing keeps it while waiting
    jobs.put(STOP)


def attempt(job):
    """What calling `job` raised (raised again in run's thread), or None."""
    try:
        job()
    except BaseException as e:
        return e
    return None


def stop_workers(jobs):
    """End the workers' threads (called when their Workers is collected): one STOP, which each worker passes on once
    its jobs are done. A put: it never waits."""
    jobs.put(STOP)
