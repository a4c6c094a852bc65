"""Lesson 10: a distillation loss (KL divergence between two softmaxes) computed in BF16 loses its gradient.

Why: the gradient of ``KL(teacher || student)`` with respect to the student's logits is ``softmax(student / T) -
softmax(teacher / T)`` (over T and the batch size): a *difference of two nearly equal probabilities* once the student
has learnt. BF16 keeps 8 significant bits, so each probability carries a relative error of up to 2^-9 and their
difference can lose most of its digits: cancellation, not overflow. The logits themselves may well be BF16 (a
BF16 model); the fix is one line, ``.float()`` on the logits before the loss, which computes the softmaxes, their
logarithms and the difference in float32. Measured against a float64 reference computed from the *same* BF16
logits, so that only the loss's own precision is judged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from amp_lessons.core.environment import one_cpu_thread

__all__ = ["distillation_batch", "kl_gradient_errors", "kl_loss"]


def kl_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 2.0) -> torch.Tensor:
    """The distillation loss: KL(teacher || student) of the temperature-softened softmaxes, times T^2."""
    log_p = F.log_softmax(student / temperature, dim=-1)
    log_q = F.log_softmax(teacher / temperature, dim=-1)
    return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean") * temperature**2


def distillation_batch(
    distance: float, *, rows: int = 32, vocabulary: int = 2048, seed: int = 0, device="cpu"
):
    """Teacher logits (std 3) and student logits ``distance`` (std) away from them, both rounded to BF16."""
    generator = torch.Generator().manual_seed(seed)
    teacher = 3 * torch.randn(rows, vocabulary, generator=generator)
    student = teacher + distance * torch.randn(rows, vocabulary, generator=generator)
    return student.to(device, torch.bfloat16), teacher.to(device, torch.bfloat16)


def _gradient(student, teacher, how: str) -> torch.Tensor:
    leaf = student.detach().clone().requires_grad_(True)
    if how == "float64":
        loss = kl_loss(leaf.double(), teacher.double())
    elif how == "float32":
        loss = kl_loss(leaf.float(), teacher.float())  # the one-line fix
    elif how == "autocast":
        with torch.autocast(leaf.device.type, dtype=torch.bfloat16):
            loss = kl_loss(leaf, teacher)
    else:
        loss = kl_loss(leaf, teacher)
    loss.backward()
    return leaf.grad.double()


def kl_gradient_errors(distances=(1.0, 0.3, 0.1, 0.03), device="cpu"):
    """Relative error ``||g - g64|| / ||g64||`` of the student's gradient, the loss computed in BF16, under
    autocast (this device's op policy) and in FP32, for students ever closer to the teacher."""
    import pandas as pd

    rows = []
    with one_cpu_thread():
        for distance in distances:
            rows.append(_errors_at(distance, device))
    return pd.DataFrame(rows)


def _errors_at(distance: float, device) -> dict:
    """One row of :func:`kl_gradient_errors`."""
    student, teacher = distillation_batch(distance, device=device)
    reference = _gradient(student, teacher, "float64")
    row = {"student-teacher distance": distance}
    for how, label in (
        ("bfloat16", "loss in BF16"),
        ("autocast", "loss under autocast"),
        ("float32", "loss in FP32"),
    ):
        gradient = _gradient(student, teacher, how)
        row[label] = float((gradient - reference).norm() / reference.norm())
    return row
