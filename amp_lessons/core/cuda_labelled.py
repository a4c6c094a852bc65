"""Tensors that *say* they live on a CUDA device, on any machine (lesson 00's warm-up check, and the
training-step probes of lessons 03 and 08).

``CudaLabelled`` is a CPU tensor whose ``.device``, ``.is_cuda`` and ``.get_device()`` report CUDA; ops on it
stay CudaLabelled, and ``.to(x.device)`` / ``.cuda()`` are no-ops as on a GPU. The numbers are computed on the
CPU as usual: only the label changes. A check hands such tensors to learner code to see which device type it
*chooses* (for autocast, say) when its data is on a GPU, without one: code that takes the device type from
the data asks for CUDA autocast, code that hard-codes ``"cpu"`` switches on CPU autocast.
"""

from __future__ import annotations

import torch
from torch import nn


class _ReportsCuda:
    """The CUDA label itself: ``.device``, ``.is_cuda`` and ``.get_device()`` answer as a GPU tensor would."""

    @property
    def device(self):
        return torch.device("cuda")

    @property
    def is_cuda(self):
        return True

    def get_device(self):
        return 0

    def to(self, *args, **kwargs):
        """``.to(x.device)`` / ``.to("cuda")`` on a tensor that says it is on CUDA is a no-op, as on a GPU; a
        dtype or memory format still applies (the numbers stay on the CPU); ``.to("cpu")`` drops the label."""
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type != "cuda":
            return torch.Tensor.as_subclass(super().to(*args, **kwargs), torch.Tensor)
        options = {"non_blocking": non_blocking, "copy": bool(kwargs.get("copy", False))}
        if memory_format is not None:
            options["memory_format"] = memory_format
        return super().to(dtype, **options) if dtype is not None else super().to(**options)

    def cuda(self, *args, **kwargs):
        """Already "on CUDA": ``.cuda()`` keeps the tensor where it is."""
        return self

    def cpu(self, *args, **kwargs):
        """Back "from the GPU": the same numbers, as a plain CPU tensor."""
        return torch.Tensor.as_subclass(super().cpu(*args, **kwargs), torch.Tensor)


class CudaLabelled(_ReportsCuda, torch.Tensor):
    """A CPU tensor that reports a CUDA device (``.device``, ``.is_cuda``, ``.get_device()``); ops on it stay
    CudaLabelled.

    Only the label is changed: the numbers are computed on the CPU as usual. It lets the checker see which
    device type a training step *chooses* for autocast when its data is on a GPU, on a machine without one.
    """


class CudaLabelledParameter(_ReportsCuda, nn.Parameter):
    """A parameter that reports a CUDA device, so a step may take its device type from the model as well."""


def label_as_cuda(model: nn.Module) -> None:
    """Replace every parameter of ``model`` by a ``CudaLabelledParameter`` holding the same values."""
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None:
                module._parameters[name] = CudaLabelledParameter(parameter.detach().clone())
