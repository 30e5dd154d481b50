"""The sampler's argmax (cpu_argmax.cpp on a CPU) against torch.argmax, which it replaces.

torch.argmax's contract: the first index of each row's maximum, and a row holding a NaN gives its
first NaN. The op keeps a maximum per vector lane, so ties across lanes, rows shorter than a
vector and tails past whole vectors each get a case.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.kernels import cpu_build
from nanoserve.kernels.cpu_argmax import argmax

pytestmark = pytest.mark.skipif(not cpu_build.available(),
                                reason=f"C++ ops not built: {cpu_build.unavailable_reason()}")


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 70), n=st.sampled_from([1, 3, 8, 9, 15, 16, 17, 100, 32000]),
       levels=st.sampled_from([0, 2, 5]), seed=st.integers(0, 999))
def test_matches_torch_argmax(rows, n, levels, seed):
    """levels > 0: values from a few integers, so most rows tie at their maximum."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, levels, (rows, n), generator=g).float() if levels
         else torch.randn(rows, n, generator=g))
    got = argmax(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1))


def test_ties_infinities_and_nans():
    x = torch.full((6, 40), -float("inf"))
    x[1, [3, 11, 35]] = 2.0  # a tie in three lanes, and one in the tail
    x[2, [37, 39]] = 5.0  # only in the tail
    x[3, [20, 9]] = float("nan")  # the first NaN wins, whatever else is larger
    x[3, 0] = float("inf")
    x[4, 38] = float("nan")  # a NaN in the tail
    x[5] = torch.arange(40.0).flip(0)  # the maximum first
    assert argmax(x).tolist() == [0, 3, 37, 9, 38, 0] == x.argmax(-1).tolist()


def test_what_the_op_does_not_take_goes_to_torch():
    for x in (torch.randn(3, 50, dtype=torch.float64), torch.randn(50, 3).t(), torch.randn(3, 50).bfloat16()):
        assert torch.equal(argmax(x), x.argmax(-1))
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.nanoserve_cpu.argmax(torch.randn(2, 9, dtype=torch.float64))
