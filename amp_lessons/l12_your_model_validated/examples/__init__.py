"""Lesson 12: recipes that run as they are — copy one next to your model and change what it builds.

- ``digits_cnn.py``: a small CNN trained on the bundled handwritten digits (the capstone's model);
- ``hf_bert.py``: a Hugging Face ``transformers`` BERT from a small config with random weights (returns a
  ``ModelOutput``, so the recipe defines ``outputs_of``);
- ``transformer_encoder.py``: ``torch.nn.TransformerEncoder`` on raw, unnormalised sensor readings — its
  attention scores overflow float16, and the report names the module where the first inf appears.

``example_path("digits_cnn")`` is the file's path, for ``validate(...)`` or ``python -m amp_lessons validate``.
"""

from __future__ import annotations

from pathlib import Path

EXAMPLES = ("digits_cnn", "hf_bert", "transformer_encoder")

__all__ = ["EXAMPLES", "example_path"]


def example_path(name: str) -> Path:
    """The path of the bundled example recipe ``name`` (one of ``EXAMPLES``)."""
    if name not in EXAMPLES:
        raise ValueError(f"no example recipe {name!r}; the examples are {', '.join(EXAMPLES)}")
    return Path(__file__).with_name(f"{name}.py")
