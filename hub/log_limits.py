"""Repeated identical log records, written once per interval with a count.

Why: when a process runs out of descriptors (``EMFILE``), every turn of its event loop fails to
accept the same connection and logs the same traceback; a slow-loris attack grew the hub's log by
~98 MB that way, filling the disk the hub's database lives on. A record is "the same" when its
logger, level, message template and exception type are; the first is written, the rest within
``TUNEHUB_LOG_REPEAT_SECONDS`` are counted, and the next one after the interval is written with
"(N more like this in the last S s)" appended and its traceback left out if the exception type
was already shown."""

from __future__ import annotations

import logging
import time

from tunehub_base.options import setting

#: Distinct kinds of record remembered at most (the oldest are forgotten).
MAX_KINDS = 1000


class RepeatFilter(logging.Filter):
    """A :class:`logging.Filter` that lets through one record of a kind per ``interval``."""

    def __init__(self, interval: float) -> None:
        super().__init__()
        self.interval = interval
        self._seen: dict[tuple[str, int, str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, str(record.msg), exc)
        now = time.monotonic()
        shown = self._seen.get(key)
        if shown is None:
            if len(self._seen) >= MAX_KINDS:
                self._seen.pop(next(iter(self._seen)))
            self._seen[key] = (now, 0)
            return True
        since, left_out = shown
        if now - since < self.interval:
            self._seen[key] = (since, left_out + 1)
            return False
        self._seen[key] = (now, 0)
        if left_out:
            record.msg = f"{record.msg} ({left_out} more like this in the last " \
                         f"{now - since:.0f} s)"
            record.exc_info, record.exc_text = None, None  # its traceback was shown already
        return True


def limit_repeats(*loggers: logging.Logger | str) -> RepeatFilter:
    """Put one :class:`RepeatFilter` (interval from ``TUNEHUB_LOG_REPEAT_SECONDS``) on every
    handler of the root logger and of ``loggers``: handlers, not loggers, because records of
    child loggers (``tornado.general``, ``asyncio``) reach them without passing their
    ancestors' logger filters."""
    repeat = RepeatFilter(float(setting("TUNEHUB_LOG_REPEAT_SECONDS").number()))
    for log in (logging.getLogger(), *loggers):
        logger = logging.getLogger(log) if isinstance(log, str) else log
        for handler in logger.handlers:
            # One per handler: the config loaded again replaces its filter, never stacks them.
            for old in [f for f in handler.filters if isinstance(f, RepeatFilter)]:
                handler.removeFilter(old)
            handler.addFilter(repeat)
    return repeat


def unlimit_repeats() -> None:
    """Take every :class:`RepeatFilter` off the handlers (tests loading the hub's config
    in one process: one test's records must not silence the next one's)."""
    for logger in [logging.getLogger(), *(logging.getLogger(name) for name in
                                          list(logging.Logger.manager.loggerDict))]:
        for handler in logger.handlers:
            for old in [f for f in handler.filters if isinstance(f, RepeatFilter)]:
                handler.removeFilter(old)
