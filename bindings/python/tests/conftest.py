"""Shared fixtures of the binding tests. The library comes from
FLASHDEC_LIBRARY (bindings/run-tests.sh sets it) or the system."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import flashdec as fd

REPO = Path(__file__).resolve().parents[3]
HEADER = REPO / "include" / "flashdec.h"


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def small_config(**kw) -> fd.CacheConfig:
    base = dict(num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, max_blocks=8, dtype=fd.DType.F32)
    base.update(kw)
    return fd.CacheConfig(**base)


@pytest.fixture
def cache():
    with fd.Cache(small_config()) as c:
        yield c


def tokens(rng: np.random.Generator, n: int, heads: int = 2, dim: int = 8, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal((n, heads, dim)).astype(dtype)


def commit_token(cache: fd.Cache, ids, rng) -> None:
    """One full transaction over every layer of ``cache``."""
    cfg = cache.config
    with cache.begin(ids) as tx:
        for layer in range(cfg.num_layers):
            tx.write_layer(layer, tokens(rng, len(ids), cfg.num_kv_heads, cfg.head_dim),
                           tokens(rng, len(ids), cfg.num_kv_heads, cfg.head_dim))
        tx.commit()


def library_file() -> str:
    return os.environ.get("FLASHDEC_LIBRARY") or fd.library_path()
