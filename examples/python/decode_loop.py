#!/usr/bin/env python3
"""A short decode loop with the Python binding: three requests, a two-layer
float16 cache, and per step one transaction that rotates Q/K with RoPE,
appends K/V layer by layer, and runs paged decode attention over each layer
(the new token included) before committing.

Run with FLASHDEC_LIBRARY=/path/to/libflashdec.so if the library is not
installed; bindings/run-tests.sh runs it.
"""

import numpy as np

import flashdec as fd

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM, BLOCK = 2, 2, 4, 64, 16


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"libflashdec {fd.version()} from {fd.library_path()}, CUDA devices: {fd.cuda_device_count()}")
    with fd.Cache(num_layers=LAYERS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_size=BLOCK,
                  max_blocks=64, dtype=fd.DType.F16) as cache:
        requests = [101, 102, 103]
        for r in requests:
            cache.add_request(r)
        for step in range(20):
            n = len(requests)
            with cache.begin(requests) as tx:
                norms = []
                for layer in range(LAYERS):
                    q = rng.standard_normal((n, Q_HEADS, HEAD_DIM)).astype(np.float16)
                    k = rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(np.float16)
                    v = rng.standard_normal((n, KV_HEADS, HEAD_DIM)).astype(np.float16)
                    q_rot = tx.write_layer_rope(layer, q, k, v, rotary_dim=HEAD_DIM, rope_base=10000.0)
                    out = cache.decode(layer, q_rot, tx=tx)
                    norms.append(float(np.linalg.norm(out.astype(np.float32))))
                tx.commit()
            if step % 5 == 4:
                m = cache.metrics()
                print(f"step {step:2d}: used_blocks={m.used_blocks} active_tokens={m.active_tokens} "
                      f"|out| per layer={[round(x, 3) for x in norms]}")
        cache.finish_request(101)
        cache.cancel_request(102)
        cache.validate()
        m = cache.metrics()
        print(f"done: commits={m.transaction_commit_count} free_blocks={m.free_blocks} "
              f"fragmentation={m.internal_fragmentation_ratio:.3f}")


if __name__ == "__main__":
    main()
