"""Kernel durations compressed to their modes (count, p50, p99) and rebuilt, as ARGUS publishes
(issue 32, item 2): the modes are found at the density's valleys, the rebuilt distribution keeps
the raw p50 and p99, and bad windows get a clear error."""

import numpy as np
import pytest

from collector.kernel_modes import compress
from rankscope.kernel_mixture import MODE_BYTES, rebuild_quantiles

RNG = np.random.default_rng(32)


def _lognormal(median_us: float, sigma: float, n: int) -> np.ndarray:
    return RNG.lognormal(np.log(median_us), sigma, n)


def test_two_shapes_of_a_matmul_are_two_modes_with_their_own_counts():
    d = np.r_[_lognormal(1200, 0.04, 4000), _lognormal(3100, 0.04, 600)]
    modes = compress(d)
    assert [m.count for m in modes] == [4000, 600]
    assert modes[0].p50_us == pytest.approx(1200, rel=0.02) and modes[1].p50_us == pytest.approx(3100, rel=0.02)
    assert all(m.p50_us <= m.p99_us for m in modes)


@pytest.mark.parametrize("sigma", [0.02, 0.1, 0.3])
def test_one_noisy_mode_stays_one(sigma):
    assert len(compress(_lognormal(800, sigma, 5000))) == 1


@pytest.mark.parametrize("shape", ["one", "two", "tail"])
def test_the_rebuilt_distribution_keeps_the_raw_p50_and_p99(shape):
    d = {"one": _lognormal(500, 0.08, 20000),
         "two": np.r_[_lognormal(500, 0.05, 15000), _lognormal(1400, 0.05, 5000)],
         "tail": np.r_[_lognormal(500, 0.05, 19500), _lognormal(5000, 0.2, 500)]}[shape]
    modes = compress(d)
    raw = np.quantile(d, [0.5, 0.99])
    rebuilt = rebuild_quantiles(modes, [0.5, 0.99])
    assert rebuilt == pytest.approx(raw, rel=0.03)
    assert len(modes) * MODE_BYTES * 50 < d.nbytes       # far smaller than the raw window


def test_a_kernel_seen_once_or_always_alike_is_one_mode():
    (one,) = compress([42.0])
    assert (one.count, one.p50_us, one.p99_us) == (1, 42.0, 42.0)
    (same,) = compress(np.full(100, 7.5))
    assert (same.count, same.p50_us, same.p99_us) == (100, 7.5, 7.5)
    assert rebuild_quantiles([same], [0.5])[0] == pytest.approx(7.5, rel=1e-3)


def test_a_bad_window_is_refused_naming_what_is_wrong():
    with pytest.raises(ValueError, match="no kernel durations"):
        compress([])
    with pytest.raises(ValueError, match=r"2 of 4 are not"):
        compress([1.0, -3.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="no modes"):
        rebuild_quantiles([], [0.5])
