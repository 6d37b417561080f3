"""A stand-in for Megatron-LM's ``Timers`` that also feeds a stage timer."""

from __future__ import annotations

from typing import Any, Protocol


class StageClock(Protocol):
    """What the stand-in needs of the stage timer (:class:`collector.stage_timer.StageTimer`)."""

    def resolves(self, name: str) -> str | None: ...

    def start(self, name: str) -> None: ...

    def stop(self, name: str, missing_ok: bool = False) -> None: ...


class MegatronTimers:
    """Drop-in for Megatron-LM's ``Timers`` (``timers(name, log_level).start()/.stop()``).

    Names that map to a stage (aliases, ``MEGATRON_ALIASES``) are timed by the
    stage timer; every call is forwarded to the wrapped Megatron ``Timers``
    (when given) so its own logging keeps working. Megatron calls its timers during
    evaluation too, so they follow the stage timer's state at each call: while it is
    paused ``start()``/``stop()`` only reach Megatron's timers, and ``stop()`` never
    raises on the stage timer's account (a stop without a start is Megatron's business).
    """

    def __init__(self, timer: StageClock, timers: Any = None):
        self._timer = timer
        self._inner = timers

    def __call__(self, name: str, log_level: int | None = None) -> MegatronTimer:
        inner = None
        if self._inner is not None:
            inner = self._inner(name, log_level) if log_level is not None else self._inner(name)
        timed = self._timer.resolves(name) is not None
        return MegatronTimer(self._timer if timed else None, name, inner)

    def __getattr__(self, attr: str) -> Any:  # log(), write(), ... of the wrapped Timers
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)


class MegatronTimer:
    """One Megatron timer: ``start()``/``stop()`` feed the stage timer and the wrapped one."""

    def __init__(self, timer: StageClock | None, name: str, inner: Any):
        self._timer = timer  # None: the name maps to no stage
        self._name = name
        self._inner = inner

    def start(self, barrier: bool = False) -> None:
        if self._inner is not None:
            self._inner.start(barrier=barrier)
        if self._timer is not None:
            self._timer.start(self._name)

    def stop(self, barrier: bool = False) -> None:
        if self._timer is not None:
            self._timer.stop(self._name, missing_ok=True)  # nothing open is ignored: never raises
        if self._inner is not None:
            self._inner.stop(barrier=barrier)

    def __getattr__(self, attr: str) -> Any:
        if self._inner is None:
            raise AttributeError(attr)
        return getattr(self._inner, attr)
