"""Small models the lessons train and break on purpose. Each says what about it matters numerically."""

from __future__ import annotations
