"""``CONVERTERS``: every data set ``convert`` knows, by the name the command line uses."""

from __future__ import annotations

from ._banking import BANKING77
from ._base import Converter
from ._clinc import CLINC150_DOMAIN, CLINC150_HIER, CLINC150_INTENT
from ._hwu import HWU64
from ._injection import PROMPT_INJECTION
from ._moderation import MODERATION
from ._routellm import ROUTELLM_GSM8K, ROUTELLM_MMLU
from ._snips import SNIPS
from ._xstest import XSTEST

__all__ = ["CONVERTERS"]

CONVERTERS: dict[str, Converter] = {
    c.name: c
    for c in (
        CLINC150_DOMAIN,
        CLINC150_INTENT,
        CLINC150_HIER,
        BANKING77,
        HWU64,
        SNIPS,
        ROUTELLM_MMLU,
        ROUTELLM_GSM8K,
        MODERATION,
        XSTEST,
        PROMPT_INJECTION,
    )
}
