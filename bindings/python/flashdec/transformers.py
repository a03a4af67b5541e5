"""FlashDec inside Hugging Face transformers.

:func:`register` adds ``"fd_paged"`` to transformers' attention interface
(``AttentionInterface``) and its mask interface. A model created with
``attn_implementation="fd_paged"`` (:data:`ATTN_IMPLEMENTATION`) then keeps its K/V in a FlashDec paged
cache, :class:`FlashDecCache`, given to ``generate`` (or ``forward``) as
``past_key_values``::

    import flashdec.transformers as fdt
    fdt.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation=fdt.ATTN_IMPLEMENTATION)
    cache = fdt.FlashDecCache(model, max_tokens=8192)
    out = model.generate(input_ids, attention_mask=mask, past_key_values=cache)

How a forward runs: the model computes Q, K and V (RoPE applied, as it does
for every attention implementation); the cache's ``update`` only hands the
layer's new K/V on to the attention function, which (layer 0) opens one
cache transaction for the step's new tokens, writes the layer's K/V into the
paged cache and runs FlashDec's paged attention over it (several tokens per
row attend causally: a prompt in one call), and (last layer) commits. Padding
tokens (a 0 in the 2-D ``attention_mask``, e.g. the left padding of a batch
of prompts) are not stored and attend to nothing; their outputs are zeros.
The model's attention variants reach the kernels: ``scaling``,
``sliding_window``, ``softcap`` (Gemma 2) and ``s_aux`` sinks (GPT-OSS).

:class:`ContinuousBatcher` is a small continuous-batching driver: requests
of any length join and leave between steps, each step is one forward over
the active requests' new tokens packed in one row (prompts in bulk, one token
per decoding request), finished requests free their blocks for the next, and
a shared prefix is computed once and attached to every request that starts
with it.

Devices follow the model: a CPU model gets a CPU cache (float32, float16 or
bfloat16), a CUDA model a CUDA cache (float16 or bfloat16; FP8 K/V with
``kv_dtype=DType.FP8_E4M3`` or ``FP8_E5M2``). What FlashDec cannot serve raises
:class:`~flashdec.FlashDecError` (UNSUPPORTED) naming the feature, before any
token is produced: beam search, cache cropping, custom 4-D masks,
non-causal or chunked attention layers, K and V of different head sizes.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

try:
    import torch
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache as _HFCache
    from transformers.cache_utils import CacheLayerMixin as _HFLayer
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # pragma: no cover - exercised only without the extras
    raise ImportError(
        "flashdec.transformers needs torch and transformers (pip install 'flashdec[transformers]')"
    ) from e

from .cache import Cache, Transaction
from .errors import FlashDecError, Status
from .ops import DecodePlan
from .types import CacheConfig, Device, DeviceType, DType, Layout

__all__ = [
    "ATTN_IMPLEMENTATION",
    "register",
    "FlashDecCache",
    "ContinuousBatcher",
    "GraphDecoder",
    "Request",
    "attention_forward",
    "padding_mask",
]

#: The name models take as ``attn_implementation`` once :func:`register` ran.
#: Not "flashdec": transformers treats every name containing "flash" as a
#: FlashAttention kernel to import (``is_flash_attention_requested``).
ATTN_IMPLEMENTATION = "fd_paged"

_TORCH_DTYPE = {DType.F32: torch.float32, DType.F16: torch.float16, DType.BF16: torch.bfloat16}
_FD_DTYPE = {v: k for k, v in _TORCH_DTYPE.items()}
_SERVED_LAYERS = ("full_attention", "sliding_attention")


def _unsupported(what: str) -> FlashDecError:
    return FlashDecError(Status.UNSUPPORTED, f"flashdec.transformers: {what}")


def register() -> None:
    """Registers ``"fd_paged"`` with transformers' attention and mask
    interfaces (idempotent; process-wide, as transformers' registry is)."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, padding_mask)


def padding_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Optional[Callable] = None,
    attention_mask: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> Optional[torch.Tensor]:
    """The mask transformers hands to :func:`attention_forward`: the 2-D
    boolean padding mask (its last ``kv_length`` columns), or None without
    one. Causality and windows are the kernels' own."""
    # No all-ones test here: it would wait for the device, and the step
    # (FlashDecCache._begin) reads the new tokens' columns once anyway.
    return None if attention_mask is None else attention_mask[:, -kv_length:]


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    s_aux: Optional[torch.Tensor] = None,
    **kwargs: Any,
) -> Tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [batch, q_heads,
    q_len, head_dim], key/value [batch, kv_heads, q_len, head_dim] (this
    step's tokens); returns ([batch, q_len, q_heads, head_dim], None).

    With a :class:`FlashDecCache` as ``past_key_values`` the tokens go into
    the paged cache and attention reads it; without a cache (``use_cache=False``)
    the call builds a one-layer FlashDec cache for the forward's tokens."""
    if dropout and module.training:
        raise _unsupported("attention dropout (training) is not served; call model.eval()")
    if attention_mask is not None and attention_mask.dim() != 2:
        raise _unsupported(f"a {attention_mask.dim()}-D attention mask (only 2-D padding masks are served)")
    if key.shape[-1] != query.shape[-1] or value.shape[-1] != query.shape[-1]:
        raise _unsupported("K and V head sizes different from Q's (e.g. multi-head latent attention)")
    variants = _Variants(
        sm_scale=float(scaling) if scaling is not None else query.shape[-1] ** -0.5,
        sliding_window=int(sliding_window or 0),
        logit_softcap=float(softcap or 0.0),
        sinks=s_aux,
    )
    layer = getattr(key, "_flashdec_layer", None)
    if layer is None:
        return _attend_once(module, query, key, value, attention_mask, variants), None
    return layer.cache._attend(layer.index, query, key, value, attention_mask, variants), None


@dataclasses.dataclass
class _Variants:
    sm_scale: float
    sliding_window: int
    logit_softcap: float
    sinks: Optional[torch.Tensor]

    def sinks_for(self, device: Device) -> Any:
        if self.sinks is None:
            return None
        s = self.sinks.detach().to(torch.float32).contiguous()
        return s.cpu().numpy() if device.type == DeviceType.CPU else s


class _Layer(_HFLayer):
    """One layer of a :class:`FlashDecCache` as transformers sees it: its
    ``update`` tags the new K/V for :func:`attention_forward` (the write
    happens there, where the padding mask is known)."""

    is_compileable = False
    is_croppable = False

    def __init__(self, cache: "FlashDecCache", index: int, sliding: bool) -> None:
        super().__init__()
        self.cache = cache
        self.index = index
        self.is_sliding = sliding
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        k = key_states.view_as(key_states)
        k._flashdec_layer = self  # type: ignore[attr-defined]
        return k, value_states

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.cache._seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache._seen

    def get_max_length(self) -> int:
        return -1


@dataclasses.dataclass
class _Step:
    """The open forward: its transaction and what every layer reuses."""

    tx: Transaction
    token_mask: Optional[torch.Tensor]  # [batch, q_len] bool; None: every token
    tables: Any  # block tables on the cache's device
    lens: Any  # effective lengths on the cache's device
    host_lens: np.ndarray  # the same lengths on the host (they plan the split layout)
    q_indptr: Any
    max_q: int
    advance: int = 0  # positions generate's rows move on by at commit (0 for a packed step)
    plan: Optional[DecodePlan] = None
    plan_scale: float = 0.0  # the softmax scale the plan was made with
    workspace: Any = None
    next_layer: int = 0


class FlashDecCache(_HFCache):
    """A FlashDec paged KV cache as a transformers ``Cache``.

    Args:
        model: the model (or its config) whose K/V it holds; its text config
            gives layers, KV heads and head size, its parameters the device
            and dtype unless given.
        max_tokens: tokens the cache must hold at once over all requests;
            the pool gets that many blocks' worth plus 64 blocks for the
            partly filled last block of each request.
        num_blocks: blocks of the pool, instead of ``max_tokens``.
        block_size: tokens per block (16).
        kv_dtype: the stored K/V type; default the model's dtype. FP8
            (``DType.FP8_E4M3`` or ``FP8_E5M2``) stores K/V in 8 bits with
            ``k_scales`` / ``v_scales`` per layer (default 1).
        prefix_blocks: blocks kept for shared prefixes
            (:meth:`ContinuousBatcher.add_prefix`); 0 turns them off.
        device, dtype: override the model's.

    Rows of ``generate``'s batch become requests ``0..batch-1`` of the cache
    at the first forward; :class:`ContinuousBatcher` manages requests itself.
    Not thread-safe (a forward is a sequence of calls on one cache).
    """

    def __init__(
        self,
        model: Any,
        *,
        max_tokens: int = 0,
        num_blocks: int = 0,
        block_size: int = 16,
        kv_dtype: Optional[DType] = None,
        k_scales: Optional[Sequence[float]] = None,
        v_scales: Optional[Sequence[float]] = None,
        prefix_blocks: int = 0,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
    ) -> None:
        config = model.config if hasattr(model, "config") else model
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        impl = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
        if impl is not None and impl != ATTN_IMPLEMENTATION:
            raise _unsupported(
                f'the model runs attn_implementation="{impl}"; a FlashDecCache needs "{ATTN_IMPLEMENTATION}" '
                "(register() first, then create the model with it)"
            )
        if not getattr(text, "is_causal", True):
            raise _unsupported("non-causal (bidirectional) attention")
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        for i, t in enumerate(layer_types):
            if t not in _SERVED_LAYERS:
                raise _unsupported(f'layer {i} is of type "{t}" (served: {", ".join(_SERVED_LAYERS)})')
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        if device is None or dtype is None:
            p = next(model.parameters()) if hasattr(model, "parameters") else None
            device = device if device is not None else (p.device if p is not None else torch.device("cpu"))
            dtype = dtype if dtype is not None else (p.dtype if p is not None else torch.float32)
        device = torch.device(device)
        if dtype not in _FD_DTYPE:
            raise _unsupported(f"model dtype {dtype} (served: float32, float16, bfloat16)")
        if device.type == "cuda" and dtype == torch.float32:
            raise _unsupported("float32 models on CUDA (load the model in bfloat16 or float16)")
        if device.type not in ("cpu", "cuda"):
            raise _unsupported(f"device {device}")
        model_dtype = _FD_DTYPE[dtype]
        stored = DType(kv_dtype) if kv_dtype is not None else model_dtype
        if not num_blocks:
            if not max_tokens:
                raise FlashDecError(Status.INVALID_ARGUMENT, "FlashDecCache: give max_tokens or num_blocks")
            num_blocks = -(-int(max_tokens) // block_size) + 64
        fd_device = Device.cuda(device.index or 0) if device.type == "cuda" else Device.cpu()
        cfg = CacheConfig(
            num_layers=len(layer_types),
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            max_blocks=int(num_blocks) + int(prefix_blocks),
            prefix_cache_capacity_blocks=int(prefix_blocks),
            dtype=stored,
            layout=Layout.TOKEN_MAJOR,
            device=fd_device,
            input_dtype=model_dtype if stored in (DType.FP8_E4M3, DType.FP8_E5M2) else None,
        )
        self.fd = Cache(cfg, k_scales=k_scales, v_scales=v_scales)
        # The cache's device and stored type, read once: Cache.config copies
        # the whole configuration, too slow for a per-layer call.
        self._fd_device = cfg.device
        self._fd_dtype = cfg.dtype
        super().__init__(layers=[_Layer(self, i, t == "sliding_attention") for i, t in enumerate(layer_types)])
        self.num_q_heads = heads
        self.device = device
        self.dtype = dtype
        # K/V go in as the cache's input type; q too on CUDA (its kernels take
        # q of the K/V input type), the model's own type on the CPU.
        self.kv_input_dtype = _TORCH_DTYPE[cfg.resolved_input_dtype]
        self.q_dtype = dtype if device.type == "cpu" else self.kv_input_dtype
        self._layer_arrays = [self.fd.layer_arrays(i) for i in range(cfg.num_layers)]
        scales = self.fd.kv_scales()
        self._scales = [(float(scales[0][i]), float(scales[1][i])) for i in range(cfg.num_layers)]
        self._seen = 0  # positions fed through generate's rows (padding included)
        self._row_ids: List[int] = []  # request id of each generate row
        self._packed: Optional[Tuple[List[int], List[int]]] = None  # ContinuousBatcher's next step
        self._step: Optional[_Step] = None
        self._graph: Optional["GraphDecoder"] = None  # set while a GraphDecoder runs the model
        self._ids = itertools.count()

    # -- transformers' Cache interface ----------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> Tuple[int, int]:
        return self._seen + query_length, 0

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def batch_size(self) -> int:
        return len(self._row_ids) if self._row_ids else -1

    def crop(self, tokens_to_remove: int) -> None:
        raise _unsupported("cropping the cache (assisted or prompt-lookup decoding)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise _unsupported("selecting batch rows of the cache (contrastive search)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise _unsupported("repeating batch rows (num_return_sequences > 1 or beam search)")

    def reset(self) -> None:
        raise _unsupported("reset(): create a new FlashDecCache instead")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise _unsupported("beam search (num_beams > 1) reorders rows; use num_beams=1")

    # -- requests ------------------------------------------------------
    def new_request(self) -> int:
        """Adds an empty request to the cache and returns its id."""
        rid = next(self._ids)
        self.fd.add_request(rid)
        return rid

    def release(self, request_id: int) -> None:
        """Finishes a request: its blocks go back to the pool (shared prefix
        blocks stay with the prefix)."""
        self.fd.finish_request(request_id)

    def set_next_step(self, request_ids: Sequence[int], token_counts: Sequence[int]) -> None:
        """The next forward's input is these requests' new tokens packed in one
        row ([1, sum(token_counts)]) in this order (used by
        :class:`ContinuousBatcher`)."""
        if len(request_ids) != len(token_counts) or not request_ids:
            raise FlashDecError(Status.INVALID_ARGUMENT, "set_next_step: one token count per request, at least one")
        self._packed = ([int(r) for r in request_ids], [int(c) for c in token_counts])

    def close(self) -> None:
        """Frees the paged cache now (also on garbage collection)."""
        self._abort_step()
        self._layer_arrays = []
        self.fd.close()

    # -- one forward -----------------------------------------------------
    def _abort_step(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            if step.plan is not None:
                step.plan.close()
            try:
                step.tx.abort()
            except FlashDecError:
                pass

    def _begin(self, query: torch.Tensor, attention_mask: Optional[torch.Tensor]) -> _Step:
        self._abort_step()  # a forward that failed midway left its step open
        batch, q_len = query.shape[0], query.shape[2]
        packed = self._packed is not None
        first = not packed and not self._row_ids  # this forward adds generate's rows
        if packed:
            ids, counts = self._packed
            self._packed = None
            if batch != 1 or q_len != sum(counts):
                raise FlashDecError(
                    Status.INVALID_ARGUMENT,
                    f"set_next_step announced {sum(counts)} tokens in one row; the forward has {batch} x {q_len}",
                )
            token_mask = None
        else:
            if first:
                self._row_ids = [self.new_request() for _ in range(batch)]
            elif len(self._row_ids) != batch:
                raise FlashDecError(
                    Status.INVALID_ARGUMENT, f"the cache holds {len(self._row_ids)} rows; this forward has {batch}"
                )
            if attention_mask is None:
                token_mask = None
                counts = [q_len] * batch
            else:
                token_mask = attention_mask[:, -q_len:].to(torch.bool)
                counts = token_mask.sum(dim=1).tolist()
            rows = [b for b in range(batch) if counts[b] > 0]
            ids = [self._row_ids[b] for b in rows]
            counts = [counts[b] for b in rows]
            if len(rows) == batch and all(c == q_len for c in counts):
                token_mask = None
        try:
            tx = self.fd.begin(ids, token_counts=counts)
        except BaseException:
            if first:  # a refused first forward leaves the cache as it found it
                for rid in self._row_ids:
                    self.fd.cancel_request(rid)
                self._row_ids = []
            raise
        try:
            step = self._device_views(tx, token_mask, max(counts))
        except BaseException:
            tx.abort()
            raise
        step.advance = 0 if packed else q_len  # generate's positions, padding included
        self._step = step
        return step

    def _device_views(self, tx: Transaction, token_mask: Any, max_q: int) -> _Step:
        """What every layer of the step reads: tables and lengths (and the
        token offsets of a multi-token step) where the decode reads them."""
        host_lens = tx.rows().effective_seq_lens
        if self._fd_device.type == DeviceType.CPU:
            indptr = tx.token_indptr_async(np.empty(len(host_lens) + 1, np.int32)) if max_q > 1 else None
            return _Step(tx, token_mask, tx.block_tables(), host_lens, host_lens, indptr, max_q)
        info = tx.info()
        dev = self.device
        tables = torch.empty((info.batch, max(1, info.max_blocks_per_seq)), dtype=torch.int32, device=dev)
        lens = torch.empty((info.batch,), dtype=torch.int32, device=dev)
        tx.block_tables_async(tables, lens)
        indptr = tx.token_indptr_async(torch.empty(info.batch + 1, dtype=torch.int32, device=dev)) if max_q > 1 else None
        return _Step(tx, token_mask, tables, lens, host_lens, indptr, max_q)

    def _attend(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        variants: _Variants,
    ) -> torch.Tensor:
        if self._graph is not None:
            return self._graph._attend(layer, query, key, value, variants)
        batch, heads, q_len, head_dim = query.shape
        if layer == 0:
            step = self._begin(query, attention_mask)
        else:
            step = self._step
            if step is None or step.next_layer != layer:
                self._abort_step()
                raise FlashDecError(Status.INVALID_STATE, f"layer {layer} ran out of order (layers go 0, 1, ...)")
        try:
            q = _pack(query, step.token_mask, self.q_dtype)
            k = _pack(key, step.token_mask, self.kv_input_dtype)
            v = _pack(value, step.token_mask, self.kv_input_dtype)
            step.tx.write_layer(layer, k, v)
            out = self._decode(step, layer, q, variants)
            step.next_layer = layer + 1
            if step.next_layer == len(self.layers):
                self._step = None
                if step.plan is not None:
                    step.plan.close()
                step.tx.commit()
                self._seen += step.advance
        except BaseException:
            self._abort_step()
            raise
        out = out.to(query.dtype)
        if step.token_mask is None:
            return out.view(batch, q_len, heads, head_dim)
        full = torch.zeros((batch, q_len, heads, head_dim), dtype=query.dtype, device=query.device)
        full[step.token_mask] = out
        return full

    def _decode(self, step: _Step, layer: int, q: torch.Tensor, variants: _Variants) -> torch.Tensor:
        if step.plan is None:
            step.plan, step.workspace = self._plan(
                q, step.tables, step.lens, variants, host_seq_lens=step.host_lens, q_indptr=step.q_indptr,
                max_q_len_hint=step.max_q if step.q_indptr is not None else 0,
            )  # fmt: skip
            step.plan_scale = variants.sm_scale
        return self._run_plan(step.plan, step.plan_scale, step.workspace, layer, q, step.tables, step.lens, variants)

    def _plan(self, q: Any, tables: Any, lens: Any, variants: _Variants, **options: Any) -> Tuple[DecodePlan, Any]:
        """A decode plan for every layer of a step (layer 0's storage stands
        for all: they share shape and type) and the workspace its runs need."""
        k_arr, v_arr = self._layer_arrays[0]
        plan = DecodePlan(
            q, k_arr, v_arr, tables, lens, sm_scale=variants.sm_scale, kv_dtype=self._fd_dtype, **options
        )
        size = plan.workspace_size
        if not size:
            return plan, None
        cpu = self._fd_device.type == DeviceType.CPU
        return plan, np.empty(size, np.uint8) if cpu else torch.empty(size, dtype=torch.uint8, device=self.device)

    def _run_plan(
        self, plan: DecodePlan, plan_scale: float, workspace: Any, layer: int, q: Any, tables: Any, lens: Any,
        variants: _Variants,
    ) -> Any:  # fmt: skip
        """One layer's decode with a step's plan: the layer's storage and
        scales, the call's variants."""
        if variants.sm_scale != plan_scale:
            raise _unsupported("a softmax scale that differs between layers of one model")
        k_arr, v_arr = self._layer_arrays[layer]
        k_scale, v_scale = self._scales[layer]
        return plan.run(
            q, k_arr, v_arr, tables, lens, workspace=workspace, k_scale=k_scale, v_scale=v_scale,
            logit_softcap=variants.logit_softcap, sliding_window=variants.sliding_window,
            sinks=variants.sinks_for(self._fd_device),
        )  # fmt: skip


def _pack(x: torch.Tensor, token_mask: Optional[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """[batch, heads, q_len, dim] -> the real tokens packed in row order,
    [tokens, heads, dim], contiguous, of ``dtype``."""
    t = x.transpose(1, 2)
    t = t.reshape(-1, t.shape[2], t.shape[3]) if token_mask is None else t[token_mask]
    return t.to(dtype).contiguous()


def _attend_once(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Optional[torch.Tensor],
    variants: _Variants,
) -> torch.Tensor:
    """Attention of a forward without a FlashDecCache (use_cache=False): the
    forward's tokens go into a one-layer cache made for the call."""
    batch, heads, q_len, head_dim = query.shape
    kv_heads = key.shape[1]
    block = 16
    with _OneLayer(kv_heads, head_dim, batch * (-(-q_len // block)) + 1, block, query) as cache:
        cache._row_ids = [cache.new_request() for _ in range(batch)]
        return cache._attend(0, query, key, value, attention_mask, variants)


class _OneLayer(FlashDecCache):
    """A one-layer FlashDecCache for :func:`_attend_once`."""

    def __init__(self, kv_heads: int, head_dim: int, num_blocks: int, block: int, like: torch.Tensor) -> None:
        cfg = types.SimpleNamespace(
            num_hidden_layers=1, num_attention_heads=kv_heads, num_key_value_heads=kv_heads,
            head_dim=head_dim, layer_types=["full_attention"],
        )  # fmt: skip
        super().__init__(cfg, num_blocks=num_blocks, block_size=block, device=like.device, dtype=like.dtype)

    def __enter__(self) -> "_OneLayer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _stack(layers: List[Any], blocks: np.ndarray) -> Any:
    """The given blocks of every layer's storage view, [num_layers, n, ...]:
    numpy for a CPU cache (its views are numpy), a torch tensor on CUDA."""
    if isinstance(layers[0], np.ndarray):
        return np.stack([a[blocks] for a in layers])
    idx = torch.as_tensor(blocks, device=layers[0].device)
    raw = [a.view(torch.uint8) if a.element_size() == 1 else a for a in layers]  # FP8: copy the bytes
    out = torch.stack([a.index_select(0, idx) for a in raw])
    return out.view(layers[0].dtype) if out.dtype != layers[0].dtype else out


# -- continuous batching ---------------------------------------------------


@dataclasses.dataclass
class Request:
    """One request of a :class:`ContinuousBatcher`."""

    prompt: List[int]
    max_new_tokens: int
    prefix: Optional[str] = None
    tokens: List[int] = dataclasses.field(default_factory=list)  # generated so far
    done: bool = False
    id: int = -1  # the cache's request id once admitted
    pending: List[int] = dataclasses.field(default_factory=list)  # tokens to feed next
    position: int = 0  # tokens already in the cache
    blocks: int = 0  # blocks reserved for it while active


class ContinuousBatcher:
    """Continuous batching of greedy (or ``select``-chosen) generation over a
    :class:`FlashDecCache`.

    Each :meth:`step` admits waiting requests while their prompts fit
    ``max_step_tokens`` and the pool's free blocks, then runs one forward over
    every active request's new tokens packed in one row: a new request's whole
    prompt (after its shared prefix), one token for the others. A request is
    done at ``eos_token_id`` or after ``max_new_tokens``; its blocks are freed
    at once and later requests reuse them.

    Args:
        model: a model created with ``attn_implementation="fd_paged"``.
        cache: its :class:`FlashDecCache` (requests are managed here).
        eos_token_id: ends a request (None: only max_new_tokens does).
        max_step_tokens: new tokens per forward at most (prompts included).
        max_batch: requests active at once at most (0: no limit but the
            pool's blocks).
        select: logits [n, vocab] -> next tokens [n] (default: argmax).
    """

    def __init__(
        self,
        model: Any,
        cache: FlashDecCache,
        *,
        eos_token_id: Optional[int] = None,
        max_step_tokens: int = 8192,
        max_batch: int = 0,
        select: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    ) -> None:
        self.model = model
        self.cache = cache
        self.eos_token_id = eos_token_id
        self.max_step_tokens = int(max_step_tokens)
        self.max_batch = int(max_batch)
        self.select = select or (lambda logits: logits.argmax(dim=-1))
        self.waiting: List[Request] = []
        self.active: List[Request] = []
        self.finished: List[Request] = []
        self._prefixes: Dict[str, int] = {}

    def add(self, prompt: Sequence[int], max_new_tokens: int, *, prefix: Optional[str] = None) -> Request:
        """Queues a request. With ``prefix`` (a name given to
        :meth:`add_prefix`) the prompt must start with that prefix's tokens;
        they are not computed again."""
        prompt = [int(t) for t in prompt]
        if not prompt or max_new_tokens < 1:
            raise FlashDecError(Status.INVALID_ARGUMENT, "add: a non-empty prompt and max_new_tokens >= 1")
        if prefix is not None:
            n = self._prefixes.get(prefix)
            if n is None:
                raise FlashDecError(Status.NOT_FOUND, f"add: no prefix named {prefix!r}")
            if len(prompt) <= n:
                raise FlashDecError(Status.INVALID_ARGUMENT, f"add: the prompt must be longer than its prefix ({n})")
        r = Request(prompt, int(max_new_tokens), prefix)
        pool = self.cache.fd.config.max_blocks
        if self._blocks_needed(r) > pool:
            raise FlashDecError(
                Status.OUT_OF_BLOCKS, f"add: the request needs {self._blocks_needed(r)} blocks; the pool has {pool}"
            )
        self.waiting.append(r)
        return r

    @torch.no_grad()
    def add_prefix(self, name: str, tokens: Sequence[int]) -> None:
        """Computes a shared prefix once (a whole number of blocks) and keeps
        its K/V in the cache's prefix pool under ``name``."""
        tokens = [int(t) for t in tokens]
        bs = self.cache.fd.config.block_size
        if not tokens or len(tokens) % bs:
            raise FlashDecError(Status.INVALID_ARGUMENT, f"add_prefix: a positive multiple of block_size ({bs}) tokens")
        # While it is computed the prefix's blocks exist twice (the scratch
        # request's and the registered copy), beside the active requests'
        # reservations, which it must not eat into.
        n = len(tokens) // bs
        m = self.cache.fd.metrics()
        room = m.max_blocks - m.resident_prefix_blocks - sum(r.blocks for r in self.active)
        if 2 * n > room:
            raise FlashDecError(
                Status.OUT_OF_BLOCKS,
                f"add_prefix: computing {n} prefix blocks needs {2 * n} free blocks beside the active "
                f"requests' reservations; {room} are",
            )
        rid = self.cache.new_request()
        try:
            self._forward([rid], [tokens], [0])
            tables, _ = self.cache.fd.export([rid])
            blocks = tables[0, : len(tokens) // bs].astype(np.int64)
            k, v = (_stack([arrays[i] for arrays in self.cache._layer_arrays], blocks) for i in (0, 1))
            self.cache.fd.register_prefix(name, k, v)
        finally:
            self.cache.release(rid)
        self._prefixes[name] = len(tokens)

    def _blocks_needed(self, r: Request) -> int:
        """Blocks a request may come to hold of its own (its shared prefix's
        blocks are the prefix's): prompt and every new token."""
        bs = self.cache.fd.config.block_size
        skip = self._prefixes[r.prefix] if r.prefix is not None else 0
        return -(-(len(r.prompt) + r.max_new_tokens) // bs) - skip // bs

    def _admit(self) -> None:
        """Admits waiting requests in order while the step's token budget,
        ``max_batch`` and the pool allow: each active request keeps a
        reservation of every block it may grow into, so admitted requests
        never run out of blocks."""
        budget = self.max_step_tokens - len(self.active)
        m = self.cache.fd.metrics()
        capacity = m.max_blocks - m.resident_prefix_blocks  # what requests may use
        reserved = sum(r.blocks for r in self.active)
        while self.waiting:
            r = self.waiting[0]
            skip = self._prefixes[r.prefix] if r.prefix is not None else 0
            need_tokens = len(r.prompt) - skip
            need_blocks = self._blocks_needed(r)
            if not self.active and need_blocks > capacity:
                raise FlashDecError(
                    Status.OUT_OF_BLOCKS,
                    f"a request needs {need_blocks} blocks; the pool has {capacity} for requests",
                )
            if not self.active and need_tokens > self.max_step_tokens:
                raise FlashDecError(Status.INVALID_ARGUMENT, "a prompt longer than max_step_tokens")
            full = self.max_batch and len(self.active) >= self.max_batch
            if full or need_tokens > budget or reserved + need_blocks > capacity:
                break
            self.waiting.pop(0)
            r.id = self.cache.new_request()
            if r.prefix is not None:
                self.cache.fd.attach_prefix(r.id, r.prefix)
            r.position, r.pending, r.blocks = skip, r.prompt[skip:], need_blocks
            self.active.append(r)
            budget -= need_tokens
            reserved += need_blocks

    @torch.no_grad()
    def step(self) -> List[Request]:
        """One forward; returns the requests that finished in it."""
        self._admit()
        if not self.active:
            return []
        logits = self._forward([r.id for r in self.active], [r.pending for r in self.active],
                               [r.position for r in self.active])  # fmt: skip
        nxt = self.select(logits).tolist()
        done = []
        for r, t in zip(self.active, nxt):
            r.position += len(r.pending)
            r.tokens.append(int(t))
            r.pending = [int(t)]
            if len(r.tokens) >= r.max_new_tokens or (self.eos_token_id is not None and t == self.eos_token_id):
                r.done = True
                done.append(r)
        for r in done:
            self.active.remove(r)
            self.cache.release(r.id)
            self.finished.append(r)
        return done

    def run(self, progress: Optional[Callable[[int], None]] = None) -> List[Request]:
        """Steps until every request is done; ``progress(n)`` hears each
        step's finished count. Returns the finished requests in order of
        finishing."""
        while self.waiting or self.active:
            done = self.step()
            if progress is not None:
                progress(len(done))
        return self.finished

    def _forward(self, ids: List[int], chunks: List[List[int]], starts: List[int]) -> torch.Tensor:
        """One packed forward; returns the logits at each request's last new token."""
        dev = self.cache.device
        counts = [len(c) for c in chunks]
        input_ids = torch.tensor([list(itertools.chain.from_iterable(chunks))], device=dev)
        positions = torch.tensor([[s + i for s, n in zip(starts, counts) for i in range(n)]], device=dev)
        last = torch.tensor(np.cumsum(counts) - 1, device=dev)
        self.cache.set_next_step(ids, counts)
        out = self.model(
            input_ids=input_ids, position_ids=positions, past_key_values=self.cache, use_cache=True,
            logits_to_keep=last,
        )  # fmt: skip
        return out.logits[0]


# -- CUDA graphs -------------------------------------------------------------


def _stored(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as the cache stores it: as is, or FP8 saturate(x / scale)
    rounded to nearest even (docs/semantics.md S1.1)."""
    if x.dtype == dtype:
        return x
    top = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-top, top).to(dtype)


class GraphDecoder:
    """Decode steps of a fixed batch of requests (one new token each),
    replayed from one CUDA graph of the whole model forward.

    The graph holds the model's kernels and, per layer, the append of the
    new K/V at the step's slots (torch indexing into the cache's storage
    views: :func:`flashdec.kv_append` checks its indices on the host, which
    a graph cannot hold) and FlashDec's paged decode (one
    :class:`~flashdec.DecodePlan` for every step, planned for ``max_seq_len``)
    over static device buffers. Each :meth:`step` does the cache's host
    bookkeeping around one replay: it opens the step's transaction, copies
    its slots, block tables and lengths into those buffers (on the stream,
    no host wait), replays, then writes each layer's K/V into the
    transaction (the same values at the same slots: the transaction's record
    of the writes) and commits.

    Args:
        model: a CUDA model created with ``attn_implementation="fd_paged"``
            whose forward has no host synchronisation for one token per row
            (Llama, Qwen2, Mistral and their kin).
        cache: its CUDA :class:`FlashDecCache`, holding ``request_ids``.
        request_ids: the batch's requests (e.g. ``cache._row_ids`` after a
            prefill through ``generate``-style forwards, or the
            :class:`ContinuousBatcher`'s ids), in row order.
        max_seq_len: the longest any of them may grow (sizes the tables).

    :meth:`step` takes each row's new token (CUDA int64 [batch]; its
    position is the row's length, from the cache) and returns the logits
    [batch, vocab] (a static buffer, overwritten by the next step). The first step runs the forward eagerly (warm-up), the
    second captures it; a step that fails aborts its transaction.
    """

    def __init__(self, model: Any, cache: FlashDecCache, request_ids: Sequence[int], max_seq_len: int) -> None:
        if cache.fd.config.device.type != DeviceType.CUDA:
            raise _unsupported("GraphDecoder needs a CUDA cache")
        self.model, self.cache = model, cache
        self.ids = [int(r) for r in request_ids]
        n, dev = len(self.ids), cache.device
        width = -(-int(max_seq_len) // cache.fd.config.block_size)
        self.max_seq_len = int(max_seq_len)
        self.tokens = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.positions = torch.zeros((n, 1), dtype=torch.long, device=dev)
        # Each step's block ids, offsets and positions: written by the host into
        # one of two pinned buffers, copied to the device without a host wait;
        # a buffer is rewritten only once its copy of two steps ago is done.
        self.staged = torch.zeros((3, n), dtype=torch.int32, device=dev)
        self.slot_index = torch.zeros((2, n), dtype=torch.long, device=dev)  # block ids, offsets
        self._pinned = [torch.zeros((3, n), dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._copied: List[Optional[torch.cuda.Event]] = [None, None]
        self.tables = torch.full((n, width), -1, dtype=torch.int32, device=dev)
        self.lens = torch.zeros((n,), dtype=torch.int32, device=dev)
        self.plan: Optional[DecodePlan] = None
        self.plan_scale = 0.0
        self.workspace: Any = None
        self.kv: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.graph: Optional[torch.cuda.CUDAGraph] = None
        self.logits: Optional[torch.Tensor] = None
        self.steps = 0

    def close(self) -> None:
        if self.plan is not None:
            self.plan.close()
            self.plan = None
        self.graph = None

    def _attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, variants: _Variants) -> torch.Tensor:
        batch, heads, q_len, head_dim = query.shape
        if q_len != 1 or batch != len(self.ids):
            raise _unsupported(f"GraphDecoder runs one token for each of its {len(self.ids)} rows")
        c = self.cache
        q = _pack(query, None, c.q_dtype)
        k = _pack(key, None, c.kv_input_dtype)
        v = _pack(value, None, c.kv_input_dtype)
        k_arr, v_arr = c._layer_arrays[layer]
        k_scale, v_scale = c._scales[layer]
        # The append as torch indexing: fd_kv_append checks its indices on the
        # host (a synchronisation a graph cannot hold). Token-major storage.
        block, offset = self.slot_index[0], self.slot_index[1]
        k_arr[block, :, offset] = _stored(k, k_scale, k_arr.dtype)
        v_arr[block, :, offset] = _stored(v, v_scale, v_arr.dtype)
        self.kv[layer] = (k, v)
        if self.plan is None:
            self.plan, self.workspace = c._plan(q, self.tables, self.lens, variants, max_seq_len_hint=self.max_seq_len)
            self.plan_scale = variants.sm_scale
        out = c._run_plan(self.plan, self.plan_scale, self.workspace, layer, q, self.tables, self.lens, variants)
        return out.to(query.dtype).view(batch, 1, heads, head_dim)

    def _forward(self) -> torch.Tensor:
        self.cache._graph = self
        try:
            out = self.model(
                input_ids=self.tokens, position_ids=self.positions, past_key_values=self.cache, use_cache=True
            )
        finally:
            self.cache._graph = None
        return out.logits[:, -1]

    @torch.no_grad()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step: ``tokens`` (int64 [batch] on the cache's device)
        is each row's new token. Returns logits [batch, vocab]."""
        c = self.cache
        tx = c.fd.begin(self.ids)
        try:
            t = tx.tokens()
            if int(t.positions.max()) >= self.max_seq_len:
                raise FlashDecError(Status.INVALID_ARGUMENT, f"a row grows past max_seq_len {self.max_seq_len}")
            i = self.steps % 2
            if self._copied[i] is not None:
                self._copied[i].synchronize()
            host = self._pinned[i].numpy()
            host[0], host[1], host[2] = t.block_ids, t.offsets, t.positions
            self.staged.copy_(self._pinned[i], non_blocking=True)
            self._copied[i] = torch.cuda.Event()
            self._copied[i].record()
            self.slot_index.copy_(self.staged[:2])
            self.positions.copy_(self.staged[2].view(-1, 1))
            tx.block_tables_async(self.tables, self.lens)
            self.tokens.copy_(tokens.view(-1, 1))
            if self.steps == 0:
                self.logits = self._forward()
            else:
                if self.graph is None:
                    self.graph = torch.cuda.CUDAGraph()
                    # thread_local: the library's own pointer queries during
                    # capture are legal; other threads' CUDA calls are not ours.
                    with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                        self.logits = self._forward()
                self.graph.replay()
            for layer in range(len(c.layers)):
                k, v = self.kv[layer]
                tx.write_layer(layer, k, v)
            tx.commit()
            if self.ids == c._row_ids:  # generate's rows: their positions moved on
                c._seen += 1
        except BaseException:
            try:
                tx.abort()
            except FlashDecError:
                pass
            raise
        self.steps += 1
        assert self.logits is not None
        return self.logits
