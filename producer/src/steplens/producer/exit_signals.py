"""The last records of a process that is told to stop leave before it does.

A signal of ``exit_signals`` (SIGTERM, which torchrun and schedulers send, and SIGINT) first
runs ``end`` in a helper thread, waited for at most the budget, then the signal's own action:

- where the signal had its default action, ``end(False)`` shuts the Monitors down; the
  default action is then restored and the signal raised again, so the process dies by it as
  it would have (its exit status says so);
- where a Python handler was there (SIGINT's ``KeyboardInterrupt``, a framework's own),
  ``end(True)`` flushes the Monitors, which go on, and that handler runs;
- an ignored signal, or one handled outside Python, is left alone.

Installed once per process, at the first Monitor made in the main thread (Python sets handlers
only there). A forked child starts with the dispositions found before (``_forget_in_child``): a
DataLoader worker that never logs dies by SIGTERM as it would without steplens, even when it is
stuck in C code that never returns to Python (a lock taken at the fork), where a Python handler
would never run and ``Pool.terminate`` would wait forever; a forked child that logs takes them
again when its Monitor starts there. A handler installed later replaces this one; if it calls
this one back, the Monitors are flushed and the signal's outcome stays that handler's. A second
signal during the wait goes straight to the signal's own action. The work runs in a helper
thread so that a lock held by the interrupted code cannot hold it up past the budget; nothing
raises out of it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

log = logging.getLogger("steplens")

_MARGIN_S = 3.0  # a shutdown's steps around the pipeline's own deadline (samplers, joins)

_previous: dict[int, Any] = {}  # signal -> the disposition found when this module took it
_ends: list[Callable[[bool], None]] = []
_budget_s = [0.0]
_handling = [False]


def install(names: Sequence[str], end: Callable[[bool], None], budget_s: float) -> list[str]:
    """Take the signals ``names`` (e.g. ``"SIGTERM"``) where they are free or held by a Python
    handler; ``end(keep_running)`` runs at each. Returns the names taken now or before."""
    if end not in _ends:
        _ends.append(end)
    _budget_s[0] = max(_budget_s[0], budget_s + _MARGIN_S)
    if threading.current_thread() is not threading.main_thread():
        return [signal.Signals(s).name for s in _previous]
    for name in names:
        sig = getattr(signal, name, None)
        if not isinstance(sig, signal.Signals) or sig in _previous:
            continue
        try:
            current = signal.getsignal(sig)
            if current is signal.SIG_IGN or current is None:
                continue  # ignored, or handled outside Python: not ours to change
            signal.signal(sig, _on_signal)
        except (ValueError, OSError) as exc:  # not the main interpreter, or a signal it refuses
            log.debug("steplens: %s not handled: %s", name, exc)
            continue
        _previous[sig] = current
    return [signal.Signals(s).name for s in _previous]


def _forget_in_child() -> None:
    """After a fork, in the child: the dispositions found before are back."""
    for sig, previous in list(_previous.items()):
        try:
            if signal.getsignal(sig) is _on_signal:
                signal.signal(sig, previous)
        except (ValueError, OSError, TypeError):
            log.debug("steplens: %s left as it was in a forked child", sig)
    _previous.clear()
    _handling[0] = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    chained = callable(previous)
    if not _handling[0]:
        _handling[0] = True
        try:
            _run_ends(keep_running=chained or signal.getsignal(signum) is not _on_signal)
        finally:
            _handling[0] = False
    if chained:
        previous(signum, frame)
    elif signal.getsignal(signum) is _on_signal:  # a handler that called this one back decides
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _run_ends(keep_running: bool) -> None:
    def work() -> None:
        for end in list(_ends):
            try:
                end(keep_running)
            except Exception:
                log.debug("steplens: ending at a signal failed", exc_info=True)

    try:
        helper = threading.Thread(target=work, name="steplens-exit", daemon=True)
        helper.start()
        helper.join(_budget_s[0])
    except Exception:
        log.debug("steplens: ending at a signal failed", exc_info=True)
