"""Lesson 11: delayed vs current scaling, and the simulated narrow accumulator."""

import matplotlib
import pytest
import torch

from amp_lessons.l11_below_16_bits import accumulate, delayed

matplotlib.use("Agg")


def test_delayed_scaling_meets_the_spike_one_step_late():
    table = delayed.delayed_vs_current(delayed.activation_stream(steps=36, spike_at=30), history=4)
    spike = table.loc[30]
    assert spike["delayed: saturated"] > 0 and spike["delayed: error of the largest"] > 0.9
    assert spike["current: error of the largest"] == 0.0
    assert table.loc[31, "delayed scale"] == pytest.approx(spike["current scale"])  # learned one step late
    assert table.loc[35, "delayed scale"] < table.loc[31, "delayed scale"]  # forgotten after the history
    assert (table.loc[:29, "delayed: saturated"] < 1e-3).all()  # a drifting amax saturates a few values too
    assert delayed.spike_figure(table, 30) is not None


def test_rank_amaxes_share_one_scale():
    table = delayed.rank_amaxes(world_size=3)
    assert table["all-reduced scale"].nunique() == 1 and table["local scale"].nunique() == 3
    assert table["all-reduced scale"].iloc[0] == table["local scale"].max()


def test_round_to_bits():
    v = torch.tensor([1.0 + 2**-14, 1.0 + 3 * 2**-14, 1.0 + 2**-13 + 2**-20, -5.0], dtype=torch.float64)
    assert accumulate.round_to_bits(v, 14).tolist() == [1.0, 1.0 + 2**-12, 1.0 + 2**-13, -5.0]
    assert accumulate.round_to_bits(v, 14, "truncate").tolist() == [1.0, 1.0 + 2**-13, 1.0 + 2**-13, -5.0]


def test_promotion_fixes_swamping():
    table = accumulate.accumulation_errors((256, 2048), rows=8)
    narrow, truncating, promoted, fp32 = table.columns
    assert table.loc[2048, truncating] > 10 * table.loc[2048, promoted]
    assert table.loc[2048, narrow] > table.loc[256, narrow]
    assert table.loc[2048, fp32] < 1e-6
    exact = accumulate.narrow_dot(torch.ones(2, 4), torch.ones(2, 4), bits=24)
    assert exact.tolist() == [4.0, 4.0]
    assert "rounded away" in accumulate.swamping_limit(14)
