"""Lesson 11: amp_lessons.l11_below_16_bits.scaling (block scales, granularity, lost values)."""

import math

import pytest
import torch

from amp_lessons.l11_below_16_bits import scaling

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=str)
def test_block_scale_rules(dtype):
    top = torch.finfo(dtype).max
    amax = torch.tensor([top, top * 1.5, top * 2**-3, 1.0, 0.0, 3e-20, 7e20])
    amax_rule = scaling.block_scales(amax, dtype, "amax")
    assert torch.allclose(amax_rule[amax > 0] * top, amax[amax > 0]) and amax_rule[4] == 1.0
    ceil = scaling.block_scales(amax, dtype, "ceil")
    live = amax > 0
    assert (torch.frexp(ceil)[0] == 0.5).all()  # powers of two
    assert (amax[live] / ceil[live] <= top).all() and (
        amax[live] / (ceil[live] / 2) > top
    ).all()  # the smallest
    floor = scaling.block_scales(amax, dtype, "floor")
    ratio = amax[live] / floor[live]
    emax = math.frexp(top)[1] - 1
    assert ((ratio >= 2.0**emax) & (ratio < 2.0 ** (emax + 1))).all()  # the OCP rule: [256, 512) for E4M3
    with pytest.raises(ValueError):
        scaling.block_scales(amax, dtype, "round")


@pytest.mark.parametrize("block", [None, "row", 16, 32])
def test_quantize_and_dequantize_round_trip(block):
    x = scaling.outlier_activations(rows=8, cols=64, seed=1)
    q, scales = scaling.quantize_blockwise(x, block, E4M3)
    assert q.dtype == E4M3 and q.shape == x.shape and torch.isfinite(q.float()).all()
    expected = {None: (1, 1), "row": (8, 1), 16: (8, 4), 32: (8, 2)}[block]
    assert tuple(scales.shape) == expected
    back = scaling.dequantize_blockwise(q, scales)
    assert ((back - x).abs() <= x.abs() / 16 + scales.max() * 2**-10).all()
    with pytest.raises(ValueError):
        scaling.quantize_blockwise(x, 48, E4M3)


def test_granularity_table_and_figure():
    import matplotlib

    matplotlib.use("Agg")
    x = scaling.outlier_activations(rows=64, cols=256, gain=100.0)
    table = scaling.granularity_table(x)
    assert list(table["scale bytes"]) == [4, 256, 512, 512, 512]
    flushed = table["flushed to zero"]
    assert flushed.iloc[0] > flushed.iloc[2] and table.loc["MX, ceil rule (exercise 11.1)", "saturated"] == 0
    assert table.loc["MX: 1x32 blocks, E8M0 scales", "saturated"] > 0  # the floor rule saturates
    axes = scaling.granularity_figure(table)
    assert len(axes) == 2


def test_mx_reference_matches_torchao():
    from amp_lessons.core.optional_libraries import quiet_import, torchao_support

    support = torchao_support()
    if not support.available:
        pytest.skip(support.reason)
    with quiet_import():
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
    x = scaling.outlier_activations(rows=16, cols=128)
    theirs = MXTensor.to_mx(x, E4M3, block_size=32).dequantize(torch.float32)
    ours = scaling.dequantize_blockwise(*scaling.quantize_blockwise(x, 32, E4M3, "floor"))
    assert torch.equal(theirs, ours)


def test_lost_shares():
    tensors = {"big": torch.linspace(-300, 300, 1001), "tiny": torch.linspace(-1e-6, 1e-6, 1001)}
    formats = {"big": E4M3, "tiny": E4M3}
    table = scaling.lost_shares(tensors, formats).set_index(["tensor", "scale choice"])
    assert table.loc[("tiny", "no scale"), "lost to zero"] == 1.0
    assert table.loc[("tiny", "one global scale"), "lost to zero"] == 1.0
    assert table.loc[("tiny", "scale per tensor"), "lost to zero"] < 0.01
    assert table.loc[("big", "scale per tensor"), "saturated"] == 0.0
    assert table.loc[("big", "one global scale"), "lost to zero"] < 0.01


def test_sqnr():
    x = torch.ones(4)
    assert scaling.sqnr_db(x, x) == math.inf and scaling.sqnr_db(x, x * 1.1) == pytest.approx(20.0)
