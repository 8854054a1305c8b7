"""Jev request ``assets``: images sent base64 in the JSON body, or as parts of a multipart body.

``{"<placeholder>": {"type": "image", "format": "png", "data_base64": "..."}}`` in JSON, or
``{"<placeholder>": {"type": "image", "part": "asset-0"}}`` naming a ``multipart/form-data`` part
(wire-formats §1.2). As on Jev, each part must be claimed by exactly one asset.
"""

from __future__ import annotations

import binascii
from base64 import b64decode
from collections.abc import Mapping
from typing import Any, Literal

from fastslow.router import Image, InvalidRequest

__all__ = ["Part", "read_assets"]

Part = tuple[str, bytes]
"""A multipart part's content type and bytes."""

_SIGNATURES: dict[bytes, Literal["png", "jpeg"]] = {b"\x89PNG\r\n\x1a\n": "png", b"\xff\xd8\xff": "jpeg"}
_FORMATS: dict[str, Literal["png", "jpeg"]] = {"png": "png", "jpg": "jpeg", "jpeg": "jpeg"}
_MEDIA_TYPES: dict[str, Literal["png", "jpeg"]] = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg"}


def _format(declared: Any, content_type: str, data: bytes, where: str) -> Literal["png", "jpeg"]:
    if declared is not None:
        if not isinstance(declared, str) or declared.lower() not in _FORMATS:
            raise InvalidRequest(f"{where}.format", "format must be png, jpg or jpeg")
        return _FORMATS[declared.lower()]
    # The SDK labels parts by their file signature and sends no format: read the signature too.
    for signature, name in _SIGNATURES.items():
        if data.startswith(signature):
            return name
    media = content_type.split(";")[0].strip().lower()
    if media in _MEDIA_TYPES:
        return _MEDIA_TYPES[media]
    raise InvalidRequest(where, "not a PNG or JPEG image (by its signature or content type)")


def _one(placeholder: str, asset: Any, parts: Mapping[str, Part], claimed: set[str]) -> Image:
    where = f"assets.{placeholder}"
    if not isinstance(asset, Mapping):
        raise InvalidRequest(where, "an asset must be an object")
    if asset.get("type") != "image":
        raise InvalidRequest(f"{where}.type", "only image assets are supported (type: image)")
    if "part" in asset:
        part = asset["part"]
        if not isinstance(part, str) or part not in parts:
            raise InvalidRequest(f"{where}.part", f"the body has no multipart part {part!r}")
        if part in claimed:
            raise InvalidRequest(f"{where}.part", f"part {part!r} is claimed by another asset")
        claimed.add(part)
        content_type, data = parts[part]
    elif "data_base64" in asset:
        encoded = asset["data_base64"]
        if not isinstance(encoded, str):
            raise InvalidRequest(f"{where}.data_base64", "must be base64 text")
        try:
            data = b64decode("".join(encoded.split()), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{where}.data_base64", "not valid base64") from None
        content_type = ""
    else:
        raise InvalidRequest(where, "an image asset needs data_base64, or part in a multipart body")
    if not data:
        raise InvalidRequest(where, "the image is empty")
    return Image(data=data, format=_format(asset.get("format"), content_type, data, where), placeholder=placeholder)


def read_assets(assets: Any, parts: Mapping[str, Part]) -> list[Image]:
    """The images of a Jev request, each carrying the placeholder text it stands for.

    Raises:
        InvalidRequest: a malformed asset, a missing or doubly claimed part, or a part no asset names.
    """
    if assets is None:
        if parts:
            raise InvalidRequest("assets", f"the body has parts {sorted(parts)} but no assets naming them")
        return []
    if not isinstance(assets, Mapping) or not assets:
        raise InvalidRequest("assets", "assets must be a non-empty object {placeholder: asset}")
    claimed: set[str] = set()
    images = [_one(str(placeholder), asset, parts, claimed) for placeholder, asset in assets.items()]
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise InvalidRequest("assets", f"no asset names the parts {unclaimed}")
    return images
