"""A canary takes production only when it is fast enough as well as correct: with a p95 bound
(``model serve --canary-latency-ms``) the counters roll a slow canary back with both figures in
the reason, and a fast one forward. The HTTP path that times each canary answer and carries out
the move is ``tests/test_canary_release.py``'s (real ``model serve``)."""

from __future__ import annotations

import subprocess
import sys

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


def test_a_bad_latency_flag_is_one_line_naming_it() -> None:
    done = subprocess.run([sys.executable, "-m", "tuner.cli", "model", "serve", "digits",
                           "--canary-share", "0.1", "--canary-latency-ms", "fast"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--canary-latency-ms" in done.stderr and "fast" in done.stderr
    assert "Traceback" not in done.stderr
