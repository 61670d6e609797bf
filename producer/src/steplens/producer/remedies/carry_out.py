"""Carrying out the stream jobs' advice on this rank: the remedies the run allows.

At a step boundary (``act(step)``, or an integration's callback; ``profile`` at
``log_step`` too, ``at_step``) each piece of advice that arrived is carried out once per
(fingerprint, action) and answered with ``acted``:

- ``skip_samples``: the named sample ids and hashes are skipped for the rest of the run by
  every ``skipping()`` wrapper (``skipping``);
- ``rewind``: the named checkpoint, one the run reported (``checkpoint(step, path)``), is
  reloaded into the model, optimizer and scheduler (``rewind``) and the next
  ``skip_batches`` batches of every ``skipping()`` wrapper are dropped; ``act`` returns the
  checkpoint's step, the step the model is at again;
- ``lower_lr``: the lr is multiplied by ``lr_factor`` (``lower_lr``), and the declared schedule
  sent again with the same factor from the next step, so the schedule check follows it and the
  change shows as an lr event;
- ``profile`` (on by default): a short ``torch.profiler`` trace (``rank_profile``), written
  and stored (``trace_upload``: S3 when configured) in a thread of its own; answered with
  where it is once stored.

Advice that changes what every replica holds (``SHARED``: ``rewind``, ``lower_lr`` for every
rank) names the step at whose end every rank carries it out, ``at_step``: it is held until
``act(step)`` with ``step >= at_step`` (a rewind under a loader that reads ahead starts that
many steps before, so the reload falls at ``at_step``). No collective: the ranks agree by the
step the stream jobs chose. A rank that first sees it past that step (the advice came late, or
the loop skipped ``act`` there) carries it out at once; the answer says how many steps late
and the ``late`` count goes up (the health record's ``errors.remedy_late``). Shared advice
without ``at_step`` (older stream jobs) is carried out on arrival, counted the same way
(``remedy_no_at_step``).

Bounds, whatever the advice says (settings of the same names): the lr never below
``lr_floor`` of the lr without lowerings (the product of the factors carried out stays at
least that: the declared schedule's lr at that step when the run follows it; a rewind that
reloads an lr from before a lowering leaves the product as it was, so the floor is reached
sooner, never later); ``max_skip_batches`` batches a rewind may skip; ``max_rewinds_per_hour``
rewinds carried out (timed by the advice's own time, the same on every rank). The rate limit,
the key check and the seen-set are the inbox's (``advice_inbox``). Past a bound: answered
``refused`` with the reason, counted (``dropped.remedy_<reason>``), logged once per reason.

Outcomes: ``acted``; ``refused`` (the run did not opt into the action, or a bound);
``declined`` (nothing to act on: no optimizer, no checkpoint named, no ``skipping()`` data, a
profile already running); ``failed`` (the remedy raised: the reason is the detail). Nothing
raises into the loop. The set of advice done is bounded (the oldest forgotten first; the
inbox never forgets what it let through).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import Any

from steplens.producer.remedies.lower_lr import lower_lr
from steplens.producer.remedies.skipping import SkipList, Skipping
from steplens.schema import RUN_RANK

log = logging.getLogger("steplens")

ACTIONS = ("skip_samples", "rewind", "lower_lr", "profile")
MAX_DONE = 4096  # (fingerprint, action) pairs remembered
MAX_CHECKPOINTS = 256  # reported checkpoints remembered (the newest)
DEFAULT_LR_FACTOR = 0.5
SHARED = frozenset({"rewind", "lower_lr"})  # every rank at the same step, or replicas differ
MAX_WAITING = 64  # shared advice held until its step
MAX_DETAIL = 500
HOUR_NS = 3600 * 10**9
ERRORS = frozenset({"late", "no_at_step"})  # counts the health record shows as errors


class Declined(Exception):
    """A remedy that cannot be carried out here; the message says why."""


class Refused(Exception):
    """A bound of the rank that the advice is past: ``reason`` (counted) and why."""

    def __init__(self, reason: str, why: str) -> None:
        super().__init__(why)
        self.reason = reason


def _shared(advice: Any) -> bool:
    return advice.action in SHARED and getattr(advice, "rank", RUN_RANK) == RUN_RANK


def _advice_ns(advice: Any) -> int:
    """When the advice was decided (at most when it arrived): the same on every rank."""
    decided, got = getattr(advice, "time_ns", None), getattr(advice, "received_ns", None)
    if decided is None or got is None:
        return time.time_ns()
    return min(int(decided), int(got))


class Remedies:
    """The remedies of one Monitor. ``allowed``: the actions the run opted into."""

    def __init__(
        self,
        monitor: Any,
        allowed: Iterable[str] = (),
        profile_dir: str | None = None,
    ) -> None:
        self.monitor = monitor
        self.allowed = frozenset(a for a in allowed if a in ACTIONS)
        self.profile_dir = profile_dir or os.path.join(tempfile.gettempdir(), "steplens-profiles")
        config = getattr(monitor, "config", None)
        self.lr_floor = float(getattr(config, "lr_floor", 0.1))
        self.max_skip_batches = int(getattr(config, "max_skip_batches", 500))
        self.max_rewinds_per_hour = int(getattr(config, "max_rewinds_per_hour", 2))
        self.lr_scale = 1.0  # the product of the lr factors carried out
        self._rewinds: deque[int] = deque(maxlen=max(1, self.max_rewinds_per_hour))  # their ns
        self.skips = SkipList()
        self._wrappers: weakref.WeakSet[Skipping] = weakref.WeakSet()
        self._done: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.checkpoints: OrderedDict[str, int] = OrderedDict()  # path -> step, as reported
        self._trace: Any = None  # (advice, RankProfile) while a trace runs
        self._storing: threading.Thread | None = None  # writing and storing the last trace
        # batches a framework's loader reads ahead of the step (its prefetch): a rewind then
        # reloads that many steps later, after the batches read before it was advised
        self.read_ahead = 0
        self._rewinding: Any = None  # (advice, targets, the step to reload at)
        self._held: list[Any] = []  # shared advice waiting for its at_step
        self._take = getattr(monitor, "advice", None)
        self._take_auto = getattr(monitor, "auto_advice", None)
        self.counts: dict[str, int] = {}  # late, no_at_step, and refusals by reason
        self._logged: set[str] = set()  # reasons of a refusal logged (once each)
        # (action, fingerprint, outcome, detail, step) of the last MAX_DONE answers, for the
        # run's own log and tests
        self.answers: list[tuple[str, str, str, str, int | None]] = []

    # ------------------------------------------------------------------ the loop's calls
    def skipping(self, source: Iterable[Any], ids: Callable[[Any], Any] | None = None) -> Skipping:
        """Wrap a loader, iterable, sampler or dataset so skipped samples never reach the loop."""
        w = _skipping_for(source, self.skips, ids)
        self._wrappers.add(w)
        return w

    def act(
        self,
        step: int,
        advice: Iterable[Any] | None = None,
        *,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        load: Callable[[str], Any] | None = None,
    ) -> int:
        """Carry out ``advice`` (default: what the Monitor received) at the end of ``step``;
        returns the step the model is at (a rewind's checkpoint step, else ``step``).
        ``model``/``optimizer``/``scheduler`` default to the watched ones. Shared advice
        (``SHARED``) waits for its ``at_step``; nothing here waits on another rank."""
        if not self.allowed:  # no remedy: nothing to read
            return step
        at = step
        try:
            if advice is None:  # nothing arrived, nothing held or under way: done
                auto = self._take_auto() if self._take_auto is not None else ()
                new = self._take() if self._take is not None else ()
                if not (new or auto or self.busy()):
                    return step
                advice = [*auto, *new]
            self._finish_profile(step, force=False)
            rewound = self._finish_rewind(step)
            at = step if rewound is None else rewound
            now: list[Any] = []
            for a in advice:
                if _shared(a) and getattr(a, "at_step", None) is not None:
                    self._hold(a, step)
                else:
                    now.append(a)
            now += self._due(step)
            if not now:
                return at
            targets = _Targets(self.monitor, model, optimizer, scheduler, load)
            for a in now:
                at = self.handle(a, step, targets, at)
        except Exception:
            self.monitor.counts.caller += 1
        return at

    def busy(self) -> bool:
        """Advice held for its step, a trace or a rewind under way: ``act`` has work even
        when nothing new arrived."""
        return bool(self._held) or self._trace is not None or self._rewinding is not None

    def _hold(self, advice: Any, step: int) -> None:
        if len(self._held) >= MAX_WAITING:
            why = f"{MAX_WAITING} pieces of shared advice already wait for their step"
            self._refuse(advice, Refused("held_full", why), step)
            return
        self._held.append(advice)

    def _due(self, step: int) -> list[Any]:
        """The held advice whose step has come, by ``at_step`` (a rewind under a loader that
        reads ahead: that many steps before, so its reload falls at ``at_step``)."""
        if not self._held:
            return []
        due: list[Any] = []
        held: list[Any] = []
        for a in self._held:
            lead = self.read_ahead if a.action == "rewind" else 0
            (due if step >= int(a.at_step) - lead else held).append(a)
        self._held = held
        return sorted(due, key=lambda a: int(a.at_step))

    def _timing(self, advice: Any, carried_at: int) -> str:
        """How shared advice carried out at the end of ``carried_at`` kept its step: "" on
        time; else counted, and said in the answer."""
        if not _shared(advice):
            return ""
        agreed = getattr(advice, "at_step", None)
        if agreed is None:
            self.count("no_at_step")
            return "; on arrival: the advice names no step for every rank (at_step)"
        late = int(carried_at) - int(agreed)
        if late <= 0:
            return ""
        self.count("late")
        return f"; {late} step{'s' if late > 1 else ''} after the agreed step {int(agreed)}"

    def count(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def dropped(self) -> dict[str, int]:
        """The refusals, for the health record's ``dropped``."""
        return {f"remedy_{k}": n for k, n in list(self.counts.items()) if k not in ERRORS}

    def errors(self) -> dict[str, int]:
        """Shared advice carried out late or without a step, for the health record's
        ``errors``."""
        return {f"remedy_{k}": n for k, n in list(self.counts.items()) if k in ERRORS}

    def at_step(self, step: int) -> None:
        """``log_step``'s share: start the trace advised (``profile``), or stop the running
        one once its bounds are reached. Never raises."""
        try:
            self._finish_profile(step, force=False)
            for a in self._auto_advice():
                self.handle(a, step, _Targets(self.monitor, None, None, None, None), step)
        except Exception:
            self.monitor.counts.caller += 1

    @property
    def tracing(self) -> bool:
        """A trace runs (``at_step`` has to see the next step boundaries)."""
        return self._trace is not None

    def _auto_advice(self) -> tuple[Any, ...]:
        take = self._take_auto
        return take() if take is not None else ()

    def reported(self, step: int, path: str) -> None:
        """A checkpoint the run reported (``checkpoint(step, path)``): only those are reloaded."""
        self.checkpoints.pop(path, None)
        self.checkpoints[path] = int(step)
        while len(self.checkpoints) > MAX_CHECKPOINTS:
            self.checkpoints.popitem(last=False)

    def close(self, step: int | None = None, timeout_s: float = 30.0) -> None:
        """Finish a running trace and wait (``timeout_s`` at most) until it is stored (at
        shutdown, or the end of training)."""
        try:
            self._finish_profile(step, force=True)
            storing = self._storing
            if storing is not None:
                storing.join(timeout_s)
        except Exception:
            self.monitor.counts.caller += 1

    # ------------------------------------------------------------------ dispatch
    def handle(self, advice: Any, step: int, targets: _Targets, at: int) -> int:
        key = (str(advice.fingerprint), str(advice.action))
        if key in self._done:
            return at
        self._done[key] = None
        while len(self._done) > MAX_DONE:
            self._done.popitem(last=False)
        if advice.action not in self.allowed:
            self._answer(advice, "refused", "the run did not opt into this remedy", step)
            return at
        try:
            detail, at = getattr(self, "_" + advice.action)(advice, step, targets, at)
        except Refused as why:
            self._refuse(advice, why, step)
        except Declined as why:
            self._answer(advice, "declined", str(why), step)
        except Exception as exc:
            self._answer(advice, "failed", f"{type(exc).__name__}: {exc}", step)
        else:
            if detail is not None:  # None: answered later (a trace)
                self._answer(advice, "acted", detail, step)
        return at

    def _refuse(self, advice: Any, why: Refused, step: int | None) -> None:
        """A bound: counted, logged once per reason, answered."""
        self.count(why.reason)
        first = why.reason not in self._logged
        self._logged.add(why.reason)
        self._answer(advice, "refused", str(why), step, log_it=first)

    def _answer(
        self, advice: Any, outcome: str, detail: str, step: int | None, log_it: bool = True
    ) -> None:
        detail = detail[:MAX_DETAIL]
        level = logging.INFO if outcome == "acted" else logging.WARNING
        if log_it and (getattr(self.monitor, "rank", 0) == 0 or outcome != "acted"):
            when = f"at step {step}" if step is not None else "when training ended"
            rule = getattr(advice, "rule", None)
            about = f"incident {advice.fingerprint}" + (f", {rule}" if rule else "")
            log.log(
                level, "steplens: %s %s %s (%s): %s", advice.action, outcome, when, about, detail
            )
        self.answers.append((advice.action, advice.fingerprint, outcome, detail, step))
        del self.answers[:-MAX_DONE]
        acted = getattr(self.monitor, "acted", None)
        if acted is not None:
            acted(advice, outcome, detail, step)

    # ------------------------------------------------------------------ the remedies
    def _skip_samples(self, advice: Any, step: int, t: _Targets, at: int) -> tuple[str, int]:
        ids, hashes = advice.sample_ids or [], advice.sample_hashes or []
        if not ids and not hashes:
            raise Declined("the advice names no sample")
        if not self._wrappers:
            raise Declined("no data goes through skipping()")
        before = self.skips.overflow
        added = self.skips.add(ids, hashes)
        over = self.skips.overflow - before
        detail = f"skipping {added} more samples for the rest of the run"
        detail += f" ({len(self.skips.ids)} ids, {len(self.skips.hashes)} hashes in all"
        return detail + (f"; {over} past the cap)" if over else ")"), at

    def _rewind(self, advice: Any, step: int, t: _Targets, at: int) -> tuple[str | None, int]:
        if not advice.checkpoint:
            raise Declined("the advice names no checkpoint")
        n = int(advice.skip_batches or 0)
        if n > self.max_skip_batches:
            why = f"skip_batches {n} is past the cap of {self.max_skip_batches} (max_skip_batches)"
            raise Refused("skip_cap", why)
        if advice.checkpoint not in self.checkpoints:  # a path from the wire: never any file
            raise Declined(
                f"{advice.checkpoint} is not a checkpoint this run reported"
                " (or one a rewind left behind)"
            )
        if t.model is None and t.load is None:
            raise Declined("no model to reload: watch() one or give load()")
        if self._rewinding is not None:
            raise Declined("a rewind is under way")
        decided = _advice_ns(advice)
        recent = sum(1 for ns in self._rewinds if decided - HOUR_NS < ns <= decided)
        if recent >= self.max_rewinds_per_hour:
            why = (
                f"{recent} rewinds within the hour already: at most "
                f"{self.max_rewinds_per_hour} (max_rewinds_per_hour)"
            )
            raise Refused("rewinds_per_hour", why)
        self._rewinds.append(decided)
        for w in list(self._wrappers):
            w.skip_next(n)
        if self.read_ahead:  # the batches already read are trained on, then reloaded over
            self._rewinding = (advice, t, step + self.read_ahead)
            return None, at
        return self._reload(advice, step, t)

    def _reload(self, advice: Any, step: int, t: _Targets) -> tuple[str, int]:
        from steplens.producer.remedies.rewind import reload

        what = reload(advice.checkpoint, t.model, t.optimizer, t.scheduler, t.load)
        back = advice.checkpoint_step
        back = int(back if back is not None else self.checkpoints.get(advice.checkpoint, step))
        detail = f"{what} from {advice.checkpoint} (step {back}) at step {step}"
        for path, saved in list(self.checkpoints.items()):  # of the trajectory left behind
            if back < saved <= step:
                del self.checkpoints[path]
        n = int(advice.skip_batches or 0)
        if n and self._wrappers:
            detail += f"; skipped the {n} batches after"
        elif n:
            detail += f"; {n} batches not skipped: no data goes through skipping()"
        return detail + self._timing(advice, step), back

    def _finish_rewind(self, step: int) -> int | None:
        """A rewind put off by the loader's read-ahead, once its step has come: the step
        the model is at after it (None: none done)."""
        if self._rewinding is None or step < self._rewinding[2]:
            return None
        advice, t, _ = self._rewinding
        self._rewinding = None
        try:
            detail, back = self._reload(advice, step, t)
        except Exception as exc:
            self._answer(advice, "failed", f"{type(exc).__name__}: {exc}", step)
            return None
        self._answer(advice, "acted", detail, step)
        return back

    def _lower_lr(self, advice: Any, step: int, t: _Targets, at: int) -> tuple[str, int]:
        if t.optimizer is None:
            raise Declined("no optimizer: watch() one or pass it")
        asked = float(advice.lr_factor or DEFAULT_LR_FACTOR)
        if not (0.0 < asked <= 1.0):  # NaN included
            raise Refused("lr_factor", f"lr_factor {asked!r} is not in (0, 1]")
        factor, held = asked, ""
        if self.lr_floor > 0:
            lowest = self.lr_floor / self.lr_scale  # the smallest factor left
            if lowest >= 1.0 - 1e-9:
                why = (
                    f"the lr is at its floor: {self.lr_floor:g} of the declared schedule's "
                    "(lr_floor)"
                )
                raise Refused("lr_floor", why)
            if factor < lowest:
                factor = lowest
                self.count("lr_floor_held")
                held = (
                    f" (x{asked:g} asked: held at its floor, {self.lr_floor:g} of the declared "
                    "schedule's; lr_floor)"
                )
        before, after = lower_lr(t.optimizer, t.scheduler, factor)
        self.lr_scale *= factor
        redeclare = getattr(self.monitor, "scale_declared_lr", None)
        if redeclare is not None:
            redeclare(step + 1, factor)
        detail = f"lr x{factor:g} from step {step + 1}: {_num(before)} -> {_num(after)}{held}"
        return detail + self._timing(advice, step), at

    def _profile(self, advice: Any, step: int, t: _Targets, at: int) -> tuple[str | None, int]:
        from steplens.producer.remedies.rank_profile import RankProfile

        if self._trace is not None or (self._storing is not None and self._storing.is_alive()):
            raise Declined("a profile is already running")
        run_id = str(getattr(self.monitor, "run_id", "run"))
        rank = int(getattr(self.monitor, "rank", 0))
        path = RankProfile.trace_path(self.profile_dir, run_id, rank, advice.fingerprint)
        self._trace = (advice, RankProfile(path, advice.duration_s, step))
        return None, at

    def _finish_profile(self, step: int | None, force: bool) -> None:
        if self._trace is None:
            return
        advice, prof = self._trace
        try:
            stopped = prof.maybe_stop(step, force)
        except Exception as exc:
            self._trace = None
            self._answer(advice, "failed", f"{type(exc).__name__}: {exc}", step)
            return
        if stopped:
            self._trace = None
            self._storing = threading.Thread(
                target=self._store_trace,
                args=(advice, prof, step),
                name="steplens-trace",
                daemon=True,
            )
            self._storing.start()

    def _store_trace(self, advice: Any, prof: Any, step: int | None) -> None:
        """The trace's thread: write it, store it, answer with where it is."""
        from steplens.producer.remedies.trace_upload import store

        try:
            what = prof.finish()
        except Exception as exc:
            self._answer(advice, "failed", f"{type(exc).__name__}: {exc}", step)
            return
        run_id = str(getattr(self.monitor, "run_id", "run"))
        rank = int(getattr(self.monitor, "rank", 0))
        config = getattr(self.monitor, "config", None)
        try:
            where = store(prof.path, config, run_id, rank, advice.fingerprint)
        except Exception as exc:
            what += f"; not uploaded ({type(exc).__name__}: {str(exc)[:120]})"
            where = prof.path
        self._answer(advice, "acted", f"trace {where}: {what}", step)


class _Targets:
    """What a remedy acts on: given, else the watched model, optimizer and scheduler."""

    def __init__(self, monitor: Any, model: Any, optimizer: Any, scheduler: Any, load: Any) -> None:
        watched = getattr(monitor, "watched", None)
        w_model, w_opt, w_sched = watched() if watched is not None else (None, None, None)
        self.model = model if model is not None else w_model
        self.optimizer = optimizer if optimizer is not None else w_opt
        self.scheduler = scheduler if scheduler is not None else w_sched
        self.load = load


def _num(v: Any) -> str:
    try:
        return f"{float(v):.3g}"
    except Exception:
        return str(v)


def _skipping_for(source: Any, skips: SkipList, ids: Any) -> Skipping:
    """A ``Skipping`` over ``source``; for a torch ``IterableDataset``, one that is an
    ``IterableDataset`` too, so a Trainer takes it as one."""
    import sys

    torch = sys.modules.get("torch")
    base: Any = None if torch is None else torch.utils.data.IterableDataset
    if base is not None and isinstance(source, base):

        class SkippingDataset(Skipping, base):
            pass

        return SkippingDataset(source, skips, ids)
    return Skipping(source, skips, ids)
