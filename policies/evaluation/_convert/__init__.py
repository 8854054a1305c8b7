"""Converters from the public data sets in ``../shared/data`` to evaluation files.

``convert(name, source_dir, out_path)`` writes the rows (explicit form), ``<out>.meta.json`` and,
on request, ``<out>.examples.yaml``; ``CONVERTERS`` lists the data sets. See ``docs/evaluation.md``.
"""

from ._base import Converter, Dataset, Item, Source, TaskSpec
from ._registry import CONVERTERS
from ._write import ConvertResult, convert, pick_examples

__all__ = [
    "CONVERTERS",
    "ConvertResult",
    "Converter",
    "Dataset",
    "Item",
    "Source",
    "TaskSpec",
    "convert",
    "pick_examples",
]
