"""Parity scenario through the Python binding; must print exactly what
bindings/parity/parity.c prints (the scenario is described there)."""

from __future__ import annotations

import dataclasses

import numpy as np

import flashdec as fd

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, BLOCK, MAX_BLOCKS = 2, 2, 4, 8, 4, 16
SEED = 20240601
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed: int) -> None:
        self.state = seed & MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def fill(self, shape: tuple) -> np.ndarray:
        n = int(np.prod(shape))
        vals = [((self.next() >> 40) - 8388608) / 8388608.0 for _ in range(n)]
        return np.array(vals, dtype=np.float32).reshape(shape)


def fnv1a(x: np.ndarray) -> int:
    h = 0xCBF29CE484222325
    for byte in np.ascontiguousarray(x, dtype="<f4").tobytes():
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return h


def bits(f: np.float32) -> str:
    return "%08x" % int(np.float32(f).view(np.uint32))


def ints(label: str, xs) -> str:
    return f" {label}=" + ",".join(str(int(x)) for x in xs)


def error_line(what: str, e: fd.FlashDecError) -> str:
    return f"error {what} status={int(e.status)} {fd.status_string(e.status)} | {e.message}"


def main() -> None:
    rng = SplitMix64(SEED)
    print(f"version {fd.version()} {fd.version_number()}")
    cfg = fd.CacheConfig(
        num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
        max_blocks=MAX_BLOCKS, dtype=fd.DType.F32,
    )  # fmt: skip
    with fd.Cache(cfg) as cache:
        for rid in (11, 22, 33):
            cache.add_request(rid)
        for step in range(6):
            ids = [11, 33] if step % 3 == 2 else [11, 22, 33]
            n = len(ids)
            tx = cache.begin(ids)
            rows = tx.rows()
            print(
                f"step {step} tx={tx.id} rows={n}" + ints("positions", rows.positions)
                + ints("blocks", rows.block_ids) + ints("offsets", rows.offsets)
                + ints("effective", rows.effective_seq_lens)
            )  # fmt: skip
            for layer in range(LAYERS):
                k = rng.fill((n, KV_HEADS, HEAD_DIM))
                v = rng.fill((n, KV_HEADS, HEAD_DIM))
                tx.write_layer(layer, k, v)
            tx.commit()
            tables, lens = cache.export(ids, cache.max_blocks_per_seq(ids))
            print(f"export stride={tables.shape[1]}" + ints("lens", lens) + ints("tables", tables.ravel()))
            for layer in range(LAYERS):
                q = rng.fill((n, Q_HEADS, HEAD_DIM))
                out = cache.decode(layer, q, ids, cpu_threads=1)
                flat = out.ravel()
                print(
                    f"decode step={step} layer={layer} hash={fnv1a(out):016x} "
                    f"first={bits(flat[0])} last={bits(flat[-1])}"
                )

        tx = cache.begin([11])
        k = rng.fill((1, KV_HEADS, HEAD_DIM))
        v = rng.fill((1, KV_HEADS, HEAD_DIM))
        try:
            tx.write_layer(1, k, v)
        except fd.FlashDecError as e:
            print(error_line("write_layer", e))
        tx.abort()
        try:
            tx.abort()
        except fd.FlashDecError as e:
            print(error_line("abort", e))
        cache.add_request(99)
        cache.finish_request(99)
        try:
            cache.add_request(99)
        except fd.FlashDecError as e:
            print(error_line("add_request", e))

        cache.finish_request(22)
        cache.cancel_request(33)
        print("states" + "".join(f" {r}={int(cache.request_state(r))}" for r in (11, 22, 33, 99, 44)))
        m = cache.metrics()
        for f in dataclasses.fields(m):
            value = getattr(m, f.name)
            print(f"metric {f.name} " + (f"{value:.6f}" if isinstance(value, float) else str(value)))
        try:
            cache.validate()
            print("validate ok")
        except fd.FlashDecError as e:
            print(f"validate {e.message}")
    print("done")


if __name__ == "__main__":
    main()
