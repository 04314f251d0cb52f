"""What keystone_local.py and blazar_local.py share: their directory, starting a service's processes so
that none outlives the script, serving until a stop, and stopping them.

A script calls `exit_on_stop_signal` first and `serve` once its arguments are checked: serve installs
`on_stop_signal` for STOP_SIGNALS before it starts anything; `Children.spawn` blocks those signals until
the new child is on the list, so a stop that arrives meanwhile still reaches it; each child gets
`stop_signal` when the script dies, however it dies (parent-death signal).
"""

import ctypes
import os
import signal
import subprocess
import sys
import time

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 15


class StartError(Exception):
    pass


class StopRequested(Exception):
    pass


def exit_on_stop_signal():
    """Stopped before it has started anything, the script has nothing to clean up: it just exits 0."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, frame: os._exit(0))


def on_stop_signal(signum, frame):
    raise StopRequested()


def empty_dir(parser, value):
    """--dir `value` as an absolute path, made when new; a parser error when it holds anything."""
    directory = os.path.abspath(value)
    os.makedirs(directory, exist_ok=True)
    if os.listdir(directory):
        parser.error(f"--dir {value}: not empty")
    return directory


def serve(script, stop_signal, start):
    """`start(children)` starts the service with `children` (a Children stopping with `stop_signal`),
    prints its JSON line and returns (process, name, log): the process the service lives as, its name and
    the log to read when it ends. Returns the exit status: 1 when that process exits (naming `log`) or
    `start` raises StartError (with its message, after `script`: ), 0 after a stop signal; every child is
    stopped on the way out."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, on_stop_signal)
    children = Children(stop_signal)
    try:
        server, name, log = start(children)
        while server.poll() is None:
            time.sleep(0.2)
        print(f"{script}: {name} exited with status {server.returncode}; see {log}", file=sys.stderr)
        return 1
    except StopRequested:
        return 0
    except StartError as error:
        print(f"{script}: {error}", file=sys.stderr)
        return 1
    finally:
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
        children.stop()


def tail(path, lines=15):
    """The last `lines` lines of the log at `path`, or "" when it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class Children:
    """The processes a script started, stopped in reverse order with `stop_signal` (the service's clean
    stop: SIGINT for uwsgi, which reloads on SIGTERM; SIGTERM for oslo.service), SIGKILL after
    STOP_TIMEOUT_S."""

    def __init__(self, stop_signal):
        self.stop_signal = stop_signal
        self.processes = []

    def _die_with_parent(self):
        """preexec_fn: the child gets the stop signal when the script dies, and takes the stop signals
        that spawn() blocks here."""
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, self.stop_signal)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def spawn(self, command, **options):
        """Popen with a stop signal held back until the child is on the list, so that stop() reaches it."""
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=self._die_with_parent,
                                     **options)
            self.processes.append(child)
            return child
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def stop(self):
        for child in reversed(self.processes):
            if child.poll() is None:
                child.send_signal(self.stop_signal)
                try:
                    child.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
