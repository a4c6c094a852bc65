"""Lesson 11: amp_lessons.l11_below_16_bits.eight_bit (format facts, overflow per cast path)."""

import math

import pytest
import torch

from amp_lessons.l01_precision_formats.formats import cast_overflow
from amp_lessons.l11_below_16_bits import eight_bit


def test_format_facts_come_from_finfo():
    facts = eight_bit.format_facts()
    assert facts.loc["float8_e4m3fn", "max"] == 448 and facts.loc["float8_e4m3fn", "infinity"] == "no"
    assert facts.loc["float8_e5m2", "max"] == 57344 and facts.loc["float8_e5m2", "infinity"] == "yes"
    assert facts.loc["float8_e4m3fn", "NaN patterns"] == 2 and facts.loc["float16", "NaN patterns"] == 2046
    assert facts.loc["float8_e5m2", "smallest subnormal"] == 2.0**-16
    if hasattr(torch, "float8_e8m0fnu"):
        assert (
            facts.loc["float8_e8m0fnu", "zero"] == "no"
            and facts.loc["float8_e8m0fnu", "bits (sign/exp/mantissa)"] == "0/8/0"
        )
    else:
        assert "float8_e8m0fnu" not in facts.index


def test_overflow_casts_per_path():
    table = eight_bit.overflow_casts()
    mine = next(c for c in table.columns if c.startswith("tensor.to"))
    clamped = table["clamp to +-max, then .to"]
    assert clamped["500.0"] == 448 and clamped["inf"] == 448 and clamped["-500.0"] == -448
    assert math.isnan(clamped["nan"]) and table[mine]["464.0"] == 448  # the tie rounds down everywhere
    expected = 448.0 if cast_overflow() == "saturate" else None
    assert (table[mine]["500.0"] == expected) if expected else math.isnan(table[mine]["500.0"])
    assert table.attrs["this build"] == cast_overflow()
    ml = [c for c in table.columns if c.startswith("ml_dtypes")]
    if ml:
        assert math.isnan(table[ml[0]]["500.0"])  # ml_dtypes does not saturate
    torchao = [c for c in table.columns if c.startswith("torchao")]
    if torchao:
        assert table[torchao[0]]["1000000.0"] == 448
    else:
        assert "torchao to_fp8_saturated" in table.attrs["missing"]


def test_overflow_casts_run_on_a_gpu_too():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    assert eight_bit.overflow_casts(device="cuda")["clamp to +-max, then .to"]["500.0"] == 448
