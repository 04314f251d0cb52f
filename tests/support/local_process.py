"""What keystone_local.py and blazar_local.py share: starting a service's processes so that none outlives
the script, and stopping them.

A script installs `on_stop_signal` for STOP_SIGNALS before it starts anything; `Children.spawn` blocks
those signals until the new child is on the list, so a stop that arrives meanwhile still reaches it; each
child gets `stop_signal` when the script dies, however it dies (parent-death signal).
"""

import ctypes
import signal
import subprocess

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
STOP_TIMEOUT_S = 15


class StartError(Exception):
    pass


class StopRequested(Exception):
    pass


def on_stop_signal(signum, frame):
    raise StopRequested()


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
