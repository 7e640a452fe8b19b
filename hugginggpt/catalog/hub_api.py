"""The Hugging Face Hub's model listing, page by page, as catalog rows.

`HubClient.pages` sends the request `HfApi.list_models(pipeline_tag=..., sort=..., expand=EXPAND)` sends
(same endpoint, parameters, headers, retries and `ModelInfo` parsing, from huggingface_hub itself) but
yields each page with the URL of the next one, which `list_models` keeps to itself: the sync stores that
URL with the page's rows in one transaction, so an interrupted sync continues at the next page.
The endpoint is `HF_ENDPOINT` (or the one given); the token is the given one, else huggingface_hub's
usual lookup (HF_TOKEN, the saved login).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The ModelInfo fields a catalog row needs (HfApi's ExpandModelProperty_T names).
EXPAND = ["pipeline_tag", "library_name", "downloads", "likes", "tags", "lastModified", "sha", "gated", "safetensors",
          "cardData", "inferenceProviderMapping"]
PAGE_SIZE = 1000  # the Hub's largest page
DTYPE_BYTES = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "BF16": 2, "F16": 2, "I16": 2, "U8": 1, "I8": 1, "F8_E4M3": 1,
               "F8_E5M2": 1, "BOOL": 1}
LANG_TAG_LEN = (2, 3)


@dataclass
class Page:
    items: list  # huggingface_hub.ModelInfo
    next_url: str | None


class HubClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None, max_retries: int = 5,
                 timeout: float = 30.0):
        from huggingface_hub import HfApi

        self.api = HfApi(endpoint=endpoint or os.environ.get("HF_ENDPOINT") or None, token=token)
        self.endpoint = self.api.endpoint.rstrip("/")
        self.max_retries = max_retries
        self.timeout = timeout

    def _headers(self) -> dict[str, str]:
        from huggingface_hub.utils import build_hf_headers

        return build_hf_headers(token=self.api.token, library_name="hugginggpt-catalog")

    def _get(self, url: str, params: dict[str, Any] | None = None):
        from huggingface_hub.utils import hf_raise_for_status, http_backoff

        r = http_backoff("GET", url, params=params, headers=self._headers(), timeout=self.timeout,
                         max_retries=self.max_retries)
        hf_raise_for_status(r)
        return r

    def pages(self, task: str, sort: str = "downloads", start_url: str | None = None,
              page_size: int = PAGE_SIZE) -> Iterator[Page]:
        """Pages of models with `pipeline_tag=task`, most downloaded (or most recently modified) first."""
        from huggingface_hub import ModelInfo

        url: str | None = start_url
        params: dict[str, Any] | None = None
        if url is None:
            url = f"{self.endpoint}/api/models"
            params = {"pipeline_tag": task, "sort": sort, "direction": -1, "limit": page_size, "expand": EXPAND}
        while url is not None:
            r = self._get(url, params)
            params = None  # the next link carries its own query
            nxt = r.links.get("next", {}).get("url")
            yield Page([ModelInfo(**item) for item in r.json()], nxt)
            url = nxt


def hub_row(info, task: str | None = None) -> dict[str, Any]:
    """A catalog row from a `ModelInfo` (listing fields only: no README is fetched)."""
    tags = list(info.tags or [])
    card = info.card_data or {}  # a ModelCardData reads like a dict (`get`): no deep copy per row
    langs = card.get("language") or [t for t in tags if len(t) in LANG_TAG_LEN and t.isalpha() and t.islower()]
    if isinstance(langs, str):
        langs = [langs]
    license_ = card.get("license") or next((t.split(":", 1)[1] for t in tags if t.startswith("license:")), None)
    params = weight_bytes = None
    st = info.safetensors
    if st is not None:
        params = int(st.total or 0) or None
        by_dtype = st.parameters or {}
        weight_bytes = sum(DTYPE_BYTES.get(k, 4) * int(v) for k, v in by_dtype.items()) or None
    providers = sorted({m.provider for m in (info.inference_provider_mapping or [])
                        if getattr(m, "status", "live") == "live"})
    last = info.last_modified.isoformat() if isinstance(info.last_modified, datetime) else info.last_modified
    pipeline = info.pipeline_tag or task
    keep_tags = [t for t in tags if ":" not in t and t not in langs and t != pipeline][:20]
    return {
        "id": info.id, "task": pipeline, "library": info.library_name, "downloads": int(info.downloads or 0),
        "likes": int(info.likes or 0), "tags": keep_tags, "language": [str(x) for x in langs][:20],
        "license": license_, "gated": info.gated or None, "params": params, "weight_bytes": weight_bytes,
        "size_mb": round(weight_bytes / 2**20, 1) if weight_bytes else None, "last_modified": last, "sha": info.sha,
        "providers": providers, "description": describe(info, pipeline, tags, card),
    }


def describe(info, task: str, tags: list[str], card: Any) -> str:
    """A short description from the listing's metadata: what it is, built on what, trained on what."""
    name = info.id.split("/")[-1].replace("-", " ").replace("_", " ")
    parts = [f"{name}: a {info.library_name or 'model'} {task.replace('-', ' ')} model by {info.id.split('/')[0]}"]
    base = card.get("base_model") or next((t.split(":")[-1] for t in tags if t.startswith("base_model:")), None)
    if base:
        parts.append(f"fine-tuned from {base if isinstance(base, str) else base[0]}")
    datasets = [t.split(":", 1)[1] for t in tags if t.startswith("dataset:")][:3]
    if datasets:
        parts.append(f"trained on {', '.join(datasets)}")
    return ", ".join(parts) + "."
