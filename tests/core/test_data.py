"""The fixed reference sets of lesson 04: deterministic, categorised, and genuinely hard for FP16/BF16."""

import pytest
import torch

from amp_lessons.core import data
from amp_lessons.core.environment import probe_autocast
from amp_lessons.l04_baseline_and_decision_boundary.validation import decide, margins

CPU = torch.device("cpu")


def fp16_autocast_works():
    return probe_autocast(CPU, torch.float16)[0]


def test_reference_set_is_fixed_and_categorised():
    first = data.reference_set()
    data._reference_set.cache_clear()
    data._trained_classifier.cache_clear()
    second = data.reference_set()
    assert first.ids == second.ids
    assert torch.equal(first.inputs, second.inputs)
    assert torch.equal(first.labels, second.labels)
    assert len(set(first.ids)) == len(first)
    assert set(first.categories) == {"normal", "edge: large", "edge: tiny", "edge: zero", "boundary"}
    assert first.inputs.dtype == torch.float32 and first.inputs.shape == (len(first), 2)
    table = first.table()
    assert list(table.columns[:2]) == ["id", "category"] and len(table) == len(first)
    assert first.counts().sum() == len(first)


def test_training_the_models_leaves_the_global_random_stream_alone():
    data._trained_classifier.cache_clear()
    data._trained_regressor.cache_clear()
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    data.classifier(), data.regressor()
    assert torch.equal(torch.rand(3), expected)


def test_labels_follow_the_rule_and_zero_has_none():
    rs = data.reference_set()
    zero = rs.categories.index("edge: zero")
    assert int(rs.labels[zero]) == -1
    others = [i for i in range(len(rs)) if i != zero]
    assert set(rs.labels[others].tolist()) <= {0, 1, 2}


def test_classifier_fixed_eval_bias_free_and_homogeneous():
    a, b = data.classifier(), data.classifier()
    assert not a.training
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(pa, pb), name
    assert all("bias" not in name for name, _ in a.named_parameters())
    x = data.preprocess(data.reference_set().inputs[:5])
    with torch.no_grad():
        assert torch.allclose(a(1000 * x), 1000 * a(x), rtol=1e-5)


def test_reference_is_finite_and_boundary_samples_are_nearly_tied():
    rs = data.reference_set()
    with torch.no_grad():
        scores = data.classifier()(data.preprocess(rs.inputs))
    assert torch.isfinite(scores).all()
    m = margins(scores)
    boundary = [i for i, c in enumerate(rs.categories) if c == "boundary"]
    assert (m[boundary] > 0).all() and (m[boundary] < 2e-2).all()
    assert float(m[boundary].min()) < 1e-4
    normal = [i for i, c in enumerate(rs.categories) if c == "normal"]
    assert (m[normal] > 0.5).all()
    # every normal sample is classified as its label in FP32
    assert torch.equal(decide(scores[normal]), rs.labels[normal])


@pytest.mark.skipif(
    not fp16_autocast_works(), reason="CPU autocast float16 not available in this torch build"
)
def test_fp16_overflows_inside_the_model_and_flushes_tiny_inputs():
    rs = data.reference_set()
    features = data.preprocess(rs.inputs)
    assert features.abs().max() < 65504  # the inputs themselves fit in FP16
    model = data.classifier()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        scores = model(features)
    large = [i for i, c in enumerate(rs.categories) if c == "edge: large"]
    assert (~torch.isfinite(scores[large]).all(dim=1)).sum() >= 1
    tiny = [i for i, c in enumerate(rs.categories) if c == "edge: tiny"]
    flushed = (scores[tiny] == 0).all(dim=1)
    assert flushed.sum() >= 1  # an input below FP16's smallest subnormal becomes an all-zero (tied) row


def test_preprocess_rejects_bad_input():
    with pytest.raises(TypeError, match="torch tensor"):
        data.preprocess([[1.0, 2.0]])
    with pytest.raises(ValueError, match=r"\[N, 2\]"):
        data.preprocess(torch.ones(3))


def test_regression_set_and_model():
    hours = data.regression_set()
    assert len(hours) == 24 and hours.inputs.shape == (24, 1) and hours.targets.shape == (24,)
    model = data.regressor()
    assert not model.training
    with torch.no_grad():
        predictions = model(hours.inputs)[:, 0]
    assert (predictions - hours.targets).abs().max() < 20  # kW: the fit is good enough to judge errors
    assert 200 < float(predictions.min()) and float(predictions.max()) < 1500


def test_classifier_moves_to_a_device_with_the_same_weights():
    model = data.classifier("cpu")
    assert next(model.parameters()).device.type == "cpu"
