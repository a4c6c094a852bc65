"""Libraries some lessons use beyond torch (torchao, transformers, lightning): can they run on *this* build?

torchao's releases each support only the newest few torch releases, and its import fails outright on an older
torch (torchao 0.18 on torch 2.4 stops at ``torch.int1``, a dtype torch 2.4 does not have). A lesson must then
skip its torchao sections and say why, while its plain-torch sections still run; the doctor reports the same.
Importing torchao also prints a line or two about its CUDA kernels and torch.compile registrations on a CPU
build: harmless, so they are kept out of the learner's output here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import logging
import warnings
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Support:
    """Whether an optional library imports here: ``available``, its ``version``, and ``reason`` when it does not."""

    name: str
    available: bool
    version: str | None
    reason: str

    def __bool__(self) -> bool:
        return self.available

    def __str__(self) -> str:
        if self.available:
            return f"{self.name} {self.version}: available"
        return f"{self.name}: not usable here ({self.reason})"


@contextlib.contextmanager
def quiet_import():
    """Hide the warnings and log lines a library prints while it is imported (torchao's CUDA-kernel notes)."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    torch_logger = logging.getLogger("torch")
    torch_level = torch_logger.level
    torch_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)
        torch_logger.setLevel(torch_level)


@cache
def library_support(name: str, *submodules: str) -> Support:
    """Try to import ``name`` (and ``name.<submodule>`` for each submodule) quietly; never raises."""
    try:
        with quiet_import():
            module = importlib.import_module(name)
            for submodule in submodules:
                importlib.import_module(f"{name}.{submodule}")
    except Exception as exc:  # a library that breaks on this torch raises anything at import time
        if importlib.util.find_spec(name) is None:
            return Support(name, False, None, f"{name} is not installed: pip install {name}")
        return Support(name, False, None, _failure(name, exc))
    return Support(name, True, getattr(module, "__version__", "?"), "")


def _failure(name: str, exc: BaseException) -> str:
    import torch

    version = _installed_version(name)
    root = exc  # a library re-raises its dependency's failure: the first link of the chain says what broke
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    detail = (f"{type(root).__name__}: {root}".splitlines() or [type(root).__name__])[0][:160]
    return (
        f"{name} {version} does not import on torch {torch.__version__} ({detail}); each {name} release supports "
        f"only recent torch releases: upgrade torch (pip install -U torch) or pick the {name} release made for yours"
    )


def _installed_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


def torchao_support() -> Support:
    """torchao with the parts lessons 10 and 11 use: float8 training, MX formats and the low-bit optimizers."""
    return library_support("torchao", "float8", "optim")
