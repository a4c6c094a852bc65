"""Lesson 05, a class round (issue 19): right answers written unlike the solution, and natural wrong answers
the other tests do not cover, each named by its own mistake.

What the round found. Fixed in check.py: a Gram product under `torch.no_grad()` or on `h.detach()` passed (the
training step was finite, but no gradient reached `features`); a new check names it. Found, not fixed: casting the
Gram back with a hard-coded `.half()` (it overflows under autocast) is told "Cast BOTH operands".
"""

import pytest
import torch

from amp_lessons.l05_nan_debugging.check import check_texture_forward as T


def r_matmul_fn(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        h32 = h.to(dtype=torch.float32)
        gram = torch.matmul(h32.transpose(-1, -2), h32).div(h.size(1))
    return model.head(torch.flatten(gram, start_dim=1))


def r_decorated_helper(model, x):
    @torch.autocast(device_type=x.device.type, enabled=False)
    def gram(h):
        h = h.float()
        return h.transpose(1, 2) @ h

    h = model.features(x)
    return model.head((gram(h) / h.shape[1]).reshape(h.shape[0], -1))


def r_type_as(model, x):
    h = model.features(x)
    with torch.autocast(device_type=str(x.device).split(":")[0], enabled=False):
        g = torch.einsum("bti,btj->bij", h.float(), h.float())
    g = g / h.shape[1]
    return model.head(g.view(g.shape[0], -1))


def _g(h):
    return h.float().transpose(1, 2) @ h.float()


def w_float_without_disabling(model, x):
    h = model.features(x)
    gram = _g(h)
    return model.head((gram / h.shape[1]).flatten(1))


def w_divide_by_channels(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
    return model.head((gram / h.shape[2]).flatten(1))


def w_set_autocast_enabled_restored_wrong(model, x):
    h = model.features(x)
    torch.set_autocast_enabled(x.device.type, False)
    gram = _g(h)
    torch.set_autocast_enabled(x.device.type, True)
    return model.head((gram / h.shape[1]).flatten(1))


def w_head_in_fp32(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
        return model.head((gram / h.shape[1]).flatten(1))


def w_scale_h_first(model, x):
    h = model.features(x) / model.features(x).shape[1]
    with torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
    return model.head(gram.flatten(1))


def w_mean_instead(model, x):
    h = model.features(x)
    with torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
    return model.head(gram.mean(0, keepdim=True).expand_as(gram).flatten(1))


def w_no_grad_block(model, x):
    h = model.features(x)
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
    return model.head((gram / h.shape[1]).flatten(1))


def w_detach_h(model, x):
    h = model.features(x).detach()
    with torch.autocast(x.device.type, enabled=False):
        gram = _g(h)
    return model.head((gram / h.shape[1]).flatten(1))


WRONG = {
    w_float_without_disabling: "Nothing was fixed",
    w_divide_by_channels: "does not reproduce TextureNet.forward",
    w_set_autocast_enabled_restored_wrong: "left autocast switched on after it returned",
    w_head_in_fp32: "wider than needed",
    w_scale_h_first: "does not reproduce TextureNet.forward",
    w_mean_instead: "does not reproduce TextureNet.forward",
    w_no_grad_block: "no gradient reaches `features`",
    w_detach_h: "no gradient reaches `features`",
}


@pytest.mark.parametrize("answer", [r_matmul_fn, r_decorated_helper, r_type_as], ids=lambda f: f.__name__)
def test_class_round_texture_right_answers_pass(answer):
    result = T(answer)
    assert result.passed, result.message


@pytest.mark.parametrize("wrong", WRONG, ids=lambda f: f.__name__)
def test_class_round_texture_wrong_answers_are_named(wrong):
    result = T(wrong)
    assert result.status == "failed", result.message
    assert WRONG[wrong] in result.message, result.message
