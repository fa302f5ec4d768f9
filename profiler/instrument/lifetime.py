"""How a worker process ends with its parent, and takes what it started with it.

The worker runs in its own session; these mechanisms keep it and everything a job starts from
outliving the command (:class:`~fusedce_profiler.instrument.worker.Worker` starts them):

- :func:`~fusedce_profiler.instrument.reaper.start_reaper`: a forked *reaper* waits on the read
  end of a *life pipe* whose write end only the parent holds; when the parent dies, however, it
  kills every process under the worker (:func:`kill_tree`), then the worker's process group.
- :func:`die_with_parent`: the kernel's ``PR_SET_PDEATHSIG`` sends the worker SIGTERM when its
  parent dies (Linux), and a watchdog thread checks the parent too (and, for a worker forked from
  a template, the template's parent: the command); either ends the worker the way
  :func:`end_worker` does.
- :func:`adopt_orphans`: the worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a
  daemon a job starts (fork, ``setsid``, fork) becomes its child when its parent exits (and, once
  exited, is waited for: :mod:`~fusedce_profiler.instrument.strays`);
- :func:`end_worker`: kills every process under the worker (:func:`kill_tree`), then its group.

Every process under a worker also carries the worker's *mark* in its environment
(:data:`MARK_VARIABLE`, inherited through fork and exec). :func:`kill_marked` finds them by it,
wherever they are in the process tree: after a worker died on its own (its exit, a crash, the
kernel's OOM killer: the daemons it adopted pass to init). A job that clears its environment
escapes the mark, not the walk; a daemon under init that forks and exits faster than a search of
/proc escapes the mark too (:func:`kill_tree` holds it while the worker lives).

The death signal is SIGTERM, not SIGKILL: a worker killed outright would hand the daemons it
adopted to init before anyone could find them. Whichever comes first, the worker's handler (at
its next Python instruction) or the reaper (the worker still alive under it), finds them as the
worker's children. A job that kills the reaper, ignores SIGTERM or holds the interpreter in C
code leaves the other two ways.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from fusedce_profiler.instrument.environ_block import holds_entry
from fusedce_profiler.instrument.proctable import (children_of, descendants, group_lives, group_of, kill_with_group,
                                                   lives, parent_of, process_state, signal_quietly, started,
                                                   stat_fields, stopped)
from fusedce_profiler.instrument.worker_log import log_of_stdout, release_log_locks, scrub_log

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

MARK_VARIABLE = "FUSEDCE_WORKER_MARK"
"""The environment variable holding a worker's mark (:func:`kill_marked`)."""
_OWN_MARK = os.environ.get(MARK_VARIABLE)  # this worker's, read before any job's code can change it
MARK_PLACEHOLDER = "-" * 64
"""The mark a worker template starts with: room in its environment block for a forked worker's own
(:func:`stamp_mark`)."""


def stamp_mark(mark: str) -> None:
    """Make ``mark`` this process's (a worker forked from a template, whose environment block is the
    template's): set it where :func:`kill_marked` reads it, the block ``/proc/PID/environ`` shows and
    forks inherit (changing ``os.environ`` changes only what an ``exec`` passes on), by writing it over
    :data:`MARK_PLACEHOLDER`, ended by a NUL. ``ValueError`` when the block holds no placeholder."""
    global _OWN_MARK
    entry = f"{MARK_VARIABLE}={MARK_PLACEHOLDER}".encode()
    fields = stat_fields(os.getpid())  # fields 50 and 51: where the block begins and ends
    begin, end = int(fields[47]), int(fields[48])
    block = ctypes.string_at(begin, end - begin)
    at = 0 if block.startswith(entry) else block.find(b"\0" + entry) + 1  # 0: not found, or first
    value = mark.encode() + b"\0"
    if not block.startswith(entry, at) or len(value) > len(MARK_PLACEHOLDER):
        raise ValueError("no room for the mark in this process's environment block")
    ctypes.memmove(begin + at + len(MARK_VARIABLE) + 1, value, len(value))
    _OWN_MARK = mark


def own_mark() -> str | None:
    """This worker's mark (:func:`stamp_mark`), as read before any job's code could change it."""
    return _OWN_MARK


def _prctl(option: int, value: int) -> None:
    """``prctl(option, value)`` on Linux; elsewhere (or without a C library that has it) nothing."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
        except (OSError, AttributeError):
            pass


def is_template(pid: int, open=open) -> bool:
    """Whether ``pid`` runs as a worker template (by its command line, which its forked workers share)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().split(b"\0")
    except OSError:
        return False
    return b"fusedce_profiler.instrument.worker_child" in words and b"template" in words


TEMPLATE_GRACE_S = 5.0
"""How long a worker template ended from outside gets to end itself (its own end waits 2 s for its workers)."""


def end_template(pid: int, grace_s: float = TEMPLATE_GRACE_S) -> None:
    """End worker template ``pid`` as it ends itself once its socket or its parent is gone — its
    workers, their daemons, and the helpers a job made its children with it
    (:mod:`~fusedce_profiler.instrument.template_process`): it is continued (``SIGCONT``) whenever it
    is stopped, for up to ``grace_s``. Killed outright, a template hands those helpers to init. One
    still alive then (a helper that keeps stopping it) is killed, and its other children, listed
    first, with their groups (this process spared: a worker or the keeper may call this)."""
    deadline = time.monotonic() + grace_s
    while lives(pid) and time.monotonic() < deadline:
        if stopped(pid):
            signal_quietly(os.kill, pid, signal.SIGCONT)
        time.sleep(0.02)
    if lives(pid):
        children = [child for child in children_of(pid) if child != os.getpid()]
        signal_quietly(os.kill, pid)
        for child in children:
            kill_with_group(child)


def command_of(pid: int) -> int | None:
    """The command ``pid`` runs for when it is a worker template (its parent); None when it is not one."""
    return parent_of(pid) if is_template(pid) else None


def end_stopped_template(pid: int, command: int | None) -> None:
    """End ``pid`` (:func:`end_template`) when it is a worker template — the worker's parent when it
    was forked from one — that is stopped (``SIGSTOP``: it notices neither its parent's end nor its
    socket's) and whose command (:func:`command_of`, read before any job ran) is gone: the command
    ends its own templates, and a template a helper continued for a moment is not one it left."""
    if command is not None and parent_of(pid) != command and is_template(pid) and stopped(pid):
        end_template(pid)


_PARENT: tuple[int, str | None, int | None] | None = None
"""This worker's parent pid, its log's path and, when the parent is a worker template, the template's
parent (the command), as :func:`die_with_parent` found them (before any job could change them)."""


def die_with_parent(parent_pid: int, spare: int) -> None:
    """Make sure this process (a worker whose reaper is ``spare``) does not outlive ``parent_pid``
    (see the module docstring): SIGTERM from the kernel when the parent dies, which the caller
    handles with :func:`end_worker`, and a watchdog thread polling the parent's pid that calls it.
    A forked worker's parent is a template, which a job may stop (``SIGSTOP``): stopped, it
    outlives the command, and would keep its worker alive. So the watchdog also watches the
    command, and ends the worker, and a stopped template, once the template's parent changes."""
    global _PARENT
    _PARENT = (parent_pid, log_of_stdout(), command_of(parent_pid))
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        end_worker(spare)

    # bound now, before any job's code runs: a back-end that replaces os.getppid, time.sleep or
    # end_worker in its worker does not blind the watchdog (what end_worker calls is looked up then)
    def watch(getppid=os.getppid, sleep=time.sleep, end=end_worker, stranded=command_gone) -> None:
        while True:
            sleep(1.0)
            if getppid() != parent_pid or stranded():
                end(spare)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def killed_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the thread that forked it) ends, across
    ``exec`` too (Linux; elsewhere nothing)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def command_gone(parent=parent_of) -> bool:
    """Whether this worker was forked from a template whose parent, the command, is gone."""
    return _PARENT is not None and _PARENT[2] is not None and parent(_PARENT[0]) != _PARENT[2]


def end_stranded_template(wait: bool = False) -> None:
    """Kill this worker's template when a job stopped it and the command is gone (see
    :func:`die_with_parent`). ``wait``: for the command to be gone while the template stays stopped,
    however long: a killed command closes its end of the job pipe before the kernel hands its
    children on, by as long as it takes to die, and a live one ends this worker itself (SIGTERM)."""
    if _PARENT is None or _PARENT[2] is None:
        return
    while stopped(_PARENT[0]) and not command_gone():
        if not wait:
            return
        time.sleep(0.05)
    end_stopped_template(_PARENT[0], _PARENT[2])


def adopt_orphans() -> None:
    """Become a child subreaper: a process a job started that leaves this process group and loses
    its parent becomes this worker's child instead of init's (Linux; elsewhere nothing)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def end_children(spare: int) -> None:
    """SIGKILL every process under this worker but ``spare`` (its reaper): the daemons it adopted
    as well as the helpers still in its group (:func:`kill_tree`)."""
    kill_tree(os.getpid(), spare)


def end_worker(spare: int) -> None:
    """End this worker: every process under it (:func:`end_children`, ``spare``: the reaper), those
    that bear its mark, then its whole group, this process included. Never returns. When its parent
    is gone (``kill -9`` of the command) it scrubs its log first, as its reaper does: whichever of the
    two kills the group first, the log is scrubbed (:func:`~fusedce_profiler.instrument.scrub.scrub_file`
    serialises the two)."""
    try:
        end_stranded_template()
        end_children(spare)
        if _OWN_MARK:
            kill_marked(_OWN_MARK, spare={spare}, since=started(os.getpid()))
        if _PARENT is not None and (os.getppid() != _PARENT[0] or command_gone()):
            release_log_locks(_PARENT[1])
            scrub_log(_PARENT[1])
    finally:
        os.killpg(0, signal.SIGKILL)
        os._exit(1)  # not reached: the group's SIGKILL ended this process


_QUIET_WALKS = 5
"""Walks in a row that must find no process not seen before the tree counts as held: /proc's lists
of children, read while processes come and go, can miss one in a walk."""


def kill_tree(root: int, spare: int) -> None:
    """SIGKILL every process under ``root`` (``root`` itself and ``spare`` left alive).

    Each process found is first *stopped* (SIGSTOP: a stopped process cannot fork), its process
    group with it, and the tree walked again until :data:`_QUIET_WALKS` walks in a row find no
    process not seen before (at most 1,000 walks); then every one is killed, with its group.
    ``root``, a child subreaper, adopts the children of each process that exits, so a daemon that
    forks and lets its parent exit over and over (whatever its session or group) stays under it.

    Why the chase ends with the tree held: a process is signalled as soon as a walk lists it, before
    any of its state is read. One that forks before its SIGSTOP lands leaves a child with a pid never
    seen, under it or (once it exits) under ``root``, so the next walk is not quiet. A zombie not seen
    before counts as new too: it ran and exited unstopped, and may have forked. A walk that finds
    nothing new therefore saw every process in the tree signalled before it could fork. (Pids are
    handed out in turn, so a held one comes round to a new process only after tens of thousands of
    forks, far longer than a chase.) A walk that dropped zombies, or read each process's state
    before signalling it, would let a daemon that forks and exits every few hundred microseconds
    look like an empty tree five walks in a row (3 runs in 21, measured). Called by ``root`` itself,
    its exited children are reaped after each walk (a worker busy in a job reaps none: a fork loop
    leaves it thousands of zombies)."""
    own_group = group_of(root)
    _stop_then_kill(lambda: descendants(root, {spare}),
                    quiet_walks=_QUIET_WALKS, walks=1000, pause_s=0.0005,
                    grouped=lambda pid: group_of(pid) not in (own_group, 0),
                    after_walk=_reap if root == os.getpid() else None)


def _stop_then_kill(find: Callable[[], list[int]], *, quiet_walks: int, walks: int, pause_s: float = 0.0,
                    grouped: Callable[[int], bool] | None = None,
                    after_walk: Callable[[], None] | None = None, hold: bool = True) -> None:
    """Stop every process ``find`` gives (and the process group of each for which ``grouped`` is
    true, whole at once: the kernel lets no member fork out of a group being signalled), calling
    ``find`` again until ``quiet_walks`` calls in a row give no pid not given before (at most
    ``walks``, ``pause_s`` apart), then SIGKILL them all. The kill is in a ``finally``: whatever
    ends the chase (a second signal), nothing it stopped is left stopped. ``after_walk``: run after
    each call and after the kill (a root reaping its exited children).

    ``hold=False``: each process found is killed at once instead of stopped (a chase whose finding
    does not need the tree kept whole). A ``finally`` runs on anything but SIGKILL: a process whose
    own ``kill -9`` can end the chase (the command) must hold nothing stopped meanwhile.

    A group is signalled only while it has lived through every walk since it was found: the kernel
    frees a group's id once its last member is gone, and a fork loop can wrap the pids round within
    the chase, so the remembered id of a group seen empty could by then name a stranger's group.
    (Between two checks, milliseconds apart, the ids do not come round again: that takes tens of
    thousands of forks.)"""
    held: set[int] = set()
    groups: set[int] = set()

    def live_groups() -> set[int]:
        groups.intersection_update([group for group in groups if group_lives(group)])  # an emptied one, for good
        return groups

    quiet = 0
    try:
        for _ in range(walks):
            new = [pid for pid in find() if pid not in held]
            for pid in new:  # first: each microsecond before the signal is one in which it may fork
                signal_quietly(os.kill, pid, signal.SIGSTOP if hold else signal.SIGKILL)
            held.update(new)
            if grouped is not None:
                groups.update(group_of(pid) for pid in new if grouped(pid))
            for group in live_groups():
                signal_quietly(os.killpg, group, signal.SIGSTOP)
            if after_walk is not None:
                after_walk()
            quiet = 0 if new else quiet + 1
            if quiet == quiet_walks:
                break
            if pause_s:
                time.sleep(pause_s)
    finally:
        for group in live_groups():
            signal_quietly(os.killpg, group)
        for pid in held:
            signal_quietly(os.kill, pid)
        if after_walk is not None:
            after_walk()


def _marked(entry: bytes, since: int | None, known: dict) -> list[int]:
    """The pids of this user's processes whose environment holds ``entry`` (``NAME=value``) and that
    started at ``since`` (clock ticks since boot) or later; ``known``: (pid, start) -> marked, of the
    processes read before (each environment is read once). A process in uninterruptible sleep is
    passed over: reading its environment could wait as long as it does."""
    found, uid = [], os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or process_state(int(name)) in ("D", "Z", "X", ""):
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:  # root reads everyone's environment: only its own
                continue
            key = (int(name), started(int(name)))
            marked = known[key] if key in known else known.setdefault(key, holds_entry(int(name), entry))
        except OSError:  # gone, or another user's
            continue
        if marked and (since is None or (key[1] or -1) >= since):
            found.append(int(name))
    return found


def kill_marked(mark: str, spare: set[int] = frozenset(), since: int | None = None) -> None:
    """SIGKILL every process bearing ``mark`` (this process and ``spare`` left alive), each as soon as
    a search finds it, searching again until two searches in a row find none new (at most 100).
    Killed at once, not stopped first as :func:`kill_tree` does: the mark finds a process wherever
    it is, so nothing needs holding still, and the command runs this search itself — a ``kill -9``
    of it mid-search would leave what it had stopped stopped for good. A search reads all of /proc
    (milliseconds): a daemon under init that forks and exits faster than that is missed; under a
    living worker :func:`kill_tree` holds it. Linux only (reads /proc); elsewhere nothing.

    Only this user's processes are searched, and with ``since`` (:func:`started` of the worker) only
    those started since the worker did: a process older than the worker never was under it,
    whatever its environment holds (a job's code can hand the mark to anyone)."""
    if not os.path.isdir("/proc"):
        return
    entry, spare, known = f"{MARK_VARIABLE}={mark}".encode(), set(spare) | {os.getpid()}, {}
    _stop_then_kill(lambda: [pid for pid in _marked(entry, since, known) if pid not in spare], quiet_walks=2,
                    walks=100, hold=False)


def _reap() -> None:
    """Reap this process's exited children (none waited for)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return
