"""A canary takes production only when it is fast enough as well as correct: with a p95 bound
(``model serve --canary-latency-ms``) the counters roll a slow canary back with both figures in
the reason, and a fast one forward. It is judged after a number of answers or a time
(``--canary-seconds``), whichever comes first, and on an error rate where one is bounded
(``--canary-error-rate``). The HTTP path that times each canary answer and carries out the
move, and the server's clock, are ``tests/test_canary_release.py``'s (real ``model serve``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tuner.serving.canary import CanaryPolicy, CanaryRelease


def _answer(release: CanaryRelease, version: int, latencies_ms: list[float]) -> object:
    move = None
    for ms in latencies_ms:
        move = release.answered(version, ms / 1000)
    return move


def test_a_slow_canary_is_rolled_back_with_its_p95_and_the_bound() -> None:
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=20, max_p95_ms=5))
    move = _answer(release, 3, [1.0] * 18 + [9.0, 9.5])  # p95 of 20 is the 19th: 9 ms
    assert move is not None and not move.forward
    assert move.reason == ("canary v3 rolled back: p95 latency 9.0 ms over 20 requests is over "
                           "the bound of 5 ms")


def test_a_fast_canary_is_rolled_forward_saying_its_p95() -> None:
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=20, max_p95_ms=5))
    assert _answer(release, 4, [2.0] * 19) is None, "moved before promote_after answers"
    move = release.answered(4, 0.030)  # one slow answer in twenty is the 5 % p95 leaves out
    assert move is not None and move.forward
    assert move.reason.endswith("p95 latency 2.0 ms (at most 5 ms)")


def test_without_a_bound_latency_does_not_matter() -> None:
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=2))
    move = _answer(release, 5, [500.0, 900.0])
    assert move is not None and move.forward


def test_a_new_canary_starts_its_own_latencies() -> None:
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=3, max_p95_ms=5))
    _answer(release, 6, [50.0, 50.0])  # v6 slow, then replaced before it could move
    move = _answer(release, 7, [1.0, 1.0, 1.0])
    assert move is not None and move.forward


class Clock:
    """A clock the test moves (the release reads time only through it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_time_moves_a_canary_before_its_count_once_it_answered_cleanly() -> None:
    clock = Clock()
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=100, max_p95_ms=5,
                                         promote_after_seconds=30), clock=clock)
    release.routed(2)  # its time starts at its first request
    clock.now += 31
    assert release.due() is None, "moved without a clean answer"
    move = release.answered(2, 0.002)
    assert move is not None and move.forward
    assert move.reason == ("canary v2: 31.0 s of traffic (at least 30 s), 1 requests answered, "
                           "0 errors (at most 0 allowed), p95 latency 2.0 ms (at most 5 ms)")
    assert release.due() is None and release.answered(2, 0.002) is None, "decided twice"


def test_the_clock_alone_moves_a_canary_whose_traffic_stopped() -> None:
    clock = Clock()
    release = CanaryRelease(CanaryPolicy(share=0.5, promote_after=100,
                                         promote_after_seconds=10), clock=clock)
    release.routed(3)
    assert release.answered(3, 0.001) is None
    clock.now += 9.9
    assert release.due() is None, "moved before its time"
    clock.now += 0.2
    move = release.due()
    assert move is not None and move.forward and "10.1 s of traffic" in move.reason
    # A slow one is rolled back when its time comes, with both figures.
    slow = CanaryRelease(CanaryPolicy(share=0.5, promote_after=100, max_p95_ms=1,
                                      promote_after_seconds=10), clock=clock)
    slow.answered(4, 0.050)
    clock.now += 10
    move = slow.due()
    assert move is not None and not move.forward
    assert move.reason == ("canary v4 rolled back: p95 latency 50.0 ms over 1 requests is over "
                           "the bound of 1 ms")


def test_an_error_rate_bound_judges_the_errors_when_the_canary_is_due() -> None:
    # No count bound: errors are judged as a rate when the canary has answered enough.
    policy = CanaryPolicy(share=0.5, promote_after=4, max_errors=None, max_error_rate=0.25)
    release = CanaryRelease(policy)
    assert release.failed(5, "boom") is None, "a rate bound rolled back at the first error"
    for _ in range(3):
        assert release.answered(5, 0.001) is None
    move = release.answered(5, 0.001)  # 1 error in 5 requests: 20 %
    assert move is not None and move.forward
    assert move.reason == ("canary v5: 4 requests answered, 1 errors, error rate 20.0% (at most "
                           "25.0%)")
    worse = CanaryRelease(policy)
    worse.failed(6, "boom")
    worse.failed(6, "boom")
    for _ in range(3):
        worse.answered(6, 0.001)
    move = worse.answered(6, 0.001)  # 2 errors in 6 requests
    assert move is not None and not move.forward
    assert move.reason == ("canary v6 rolled back: error rate 33.3% (2 errors in 6 requests) "
                           "is over the bound of 25.0%")


def test_a_bad_latency_flag_is_one_line_naming_it() -> None:
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "model", "serve", "digits",
                           "--canary-share", "0.1", "--canary-latency-ms", "fast"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--canary-latency-ms" in done.stderr and "fast" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_time_and_error_flags_name_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    from tuner.cli import build_parser

    for flag, value in (("--canary-seconds", "soon"), ("--canary-seconds", "0"),
                        ("--canary-error-rate", "1.5"), ("--canary-errors", "-1")):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(["model", "serve", "digits", "--canary-share", "0.1",
                                       flag, value])
        said = capsys.readouterr().err
        assert exit_.value.code == 2 and flag in said and value in said, said
