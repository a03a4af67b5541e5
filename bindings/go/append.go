package flashdec

// The checked append primitives fd_kv_append / fd_rope_kv_append (S3.2): K/V
// of new tokens written at explicit (block, offset) slots of caller-owned
// paged storage, with no allocator or request state.
//
// fd_kv_append_params holds pointers, and cgo forbids passing C a Go struct
// that holds Go pointers. Instead of copying the slices into C memory (as
// Decode does), the C helper below receives every buffer as a plain argument
// (Go pointers to pointer-free memory, allowed for the duration of a call)
// and fills the struct on the C stack: zero-copy, and C keeps nothing.

/*
#include "flashdec.h"

static fd_status fdgo_kv_append(int rope, const fd_kv_append_params *shape, const void *q, void *q_out,
                                const void *k, const void *v, void *k_cache, void *v_cache,
                                const int32_t *block_ids, const int32_t *offsets, const int32_t *positions) {
	fd_kv_append_params p = *shape;
	p.q = q;
	p.q_out = q_out;
	p.k = k;
	p.v = v;
	p.k_cache = k_cache;
	p.v_cache = v_cache;
	p.block_ids = block_ids;
	p.offsets = offsets;
	p.positions = positions;
	return rope ? fd_rope_kv_append(&p) : fd_kv_append(&p);
}
*/
import "C"

import "runtime"

// KVPages is writable paged K/V storage of one layer in Go slices, packed in
// Layout: token-major [num_blocks, NumKVHeads, BlockSize, HeadDim] or
// dim-major [num_blocks, NumKVHeads, HeadDim, BlockSize]. Of the appended
// K/V's type, or FP8 bits (uint8) with KVAppendTyped / RopeKVAppendTyped.
type KVPages[T Elem] struct {
	K, V                           []T
	NumKVHeads, HeadDim, BlockSize uint32
	Layout                         Layout
}

// AppendOptions are the optional parts of KVAppendTyped / RopeKVAppendTyped:
// the quantisation scales fd_kv_append_params.k_scale / v_scale (K is stored
// as saturate(k / KScale), V likewise; 0: 1). Otherwise finite and > 0, and
// other than 1 only into FP8 pages, else the library's InvalidArgument
// naming the field. RopeStyle is RopeKVAppendTyped's RoPE convention
// (fd_kv_append_params.rope_style, as RopeApplyStyle; zero value
// RopeSplitHalf; KVAppendTyped ignores it).
type AppendOptions struct {
	KScale, VScale float32
	RopeStyle      RopeStyle
}

// appendShape checks the slices against each other and returns the
// pointer-free part of the parameters; the token count is len(blockIDs).
func appendShape[T, S Elem](dtype, cacheDType DType, pages KVPages[S], k, v []T, blockIDs, offsets []int32,
	opt AppendOptions) (C.fd_kv_append_params, error) {
	var p C.fd_kv_append_params
	if err := checkElem[T](dtype, "k"); err != nil {
		return p, err
	}
	if err := checkElem[S](cacheDType, "pages"); err != nil {
		return p, err
	}
	n := len(blockIDs)
	if n == 0 {
		return p, invalid("block_ids: at least one token is needed")
	}
	if len(offsets) != n {
		return p, invalid("offsets: expected %d entries (one per token), got %d", n, len(offsets))
	}
	if !fitsU32(n) {
		return p, invalid("block_ids: %d tokens do not fit in uint32", n)
	}
	kvElems, ok := elemCount(n, int(pages.NumKVHeads), int(pages.HeadDim))
	if !ok {
		return p, invalid("k/v: %d x %d x %d elements overflow", n, pages.NumKVHeads, pages.HeadDim)
	}
	if len(k) != kvElems || len(v) != kvElems {
		return p, invalid("k/v: expected %d elements (%d x %d x %d), got %d and %d", kvElems, n, pages.NumKVHeads, pages.HeadDim, len(k), len(v))
	}
	block, ok := elemCount(int(pages.NumKVHeads), int(pages.HeadDim), int(pages.BlockSize))
	if !ok {
		return p, invalid("pages: a block of %d x %d x %d elements overflows", pages.NumKVHeads, pages.BlockSize, pages.HeadDim)
	}
	if block == 0 || len(pages.K) == 0 || len(pages.K)%block != 0 {
		return p, invalid("pages.K: %d elements is not a positive multiple of a block (%d)", len(pages.K), block)
	}
	if !fitsU32(len(pages.K) / block) {
		return p, invalid("pages.K: %d blocks do not fit in uint32", len(pages.K)/block)
	}
	if len(pages.V) != len(pages.K) {
		return p, invalid("pages.V: expected %d elements like pages.K, got %d", len(pages.K), len(pages.V))
	}
	C.fd_kv_append_params_init(&p)
	p.dtype, p.cache_dtype, p.layout = C.int32_t(dtype), C.int32_t(cacheDType), C.int32_t(pages.Layout)
	p.k_scale, p.v_scale = C.float(orOne(opt.KScale)), C.float(orOne(opt.VScale))
	p.num_tokens, p.num_kv_heads, p.head_dim = C.uint32_t(n), C.uint32_t(pages.NumKVHeads), C.uint32_t(pages.HeadDim)
	p.block_size, p.num_blocks = C.uint32_t(pages.BlockSize), C.uint32_t(len(pages.K)/block)
	return p, nil
}

// KVAppend writes token i's K and V ([n, num_kv_heads, head_dim] each, n =
// len(blockIDs)) into slot (blockIDs[i], offsets[i]) of pages. Every index is
// checked first: on error nothing is written.
func KVAppend[T Elem](dtype DType, pages KVPages[T], k, v []T, blockIDs, offsets []int32) error {
	return KVAppendTyped(dtype, dtype, pages, k, v, blockIDs, offsets, AppendOptions{})
}

// KVAppendTyped is KVAppend into pages of cacheDType (fd_kv_append_params.
// cache_dtype): dtype itself, or FP8E4M3 / FP8E5M2 (uint8 pages), where K
// and V are stored as saturate(x / scale) rounded to nearest even
// (docs/semantics.md S1.1) with opt's scales.
func KVAppendTyped[T, S Elem](dtype, cacheDType DType, pages KVPages[S], k, v []T, blockIDs, offsets []int32, opt AppendOptions) error {
	p, err := appendShape(dtype, cacheDType, pages, k, v, blockIDs, offsets, opt)
	if err != nil {
		return err
	}
	err = call(func() C.fd_status {
		return C.fdgo_kv_append(0, &p, nil, nil, dataPtr(k), dataPtr(v), dataPtr(pages.K), dataPtr(pages.V),
			i32Ptr(blockIDs), i32Ptr(offsets), nil)
	})
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	runtime.KeepAlive(pages.K)
	runtime.KeepAlive(pages.V)
	runtime.KeepAlive(blockIDs)
	runtime.KeepAlive(offsets)
	return err
}

// RopeKVAppend is the fused RoPE + append: rotates q ([n, numQHeads,
// head_dim]) and k of token i at positions[i], writes rotated K and raw V
// into (blockIDs[i], offsets[i]) and the rotated Q into qOut (q's length; it
// may be q itself). On error nothing is written, qOut included.
func RopeKVAppend[T Elem](dtype DType, pages KVPages[T], q []T, numQHeads uint32, k, v []T, blockIDs, offsets, positions []int32,
	rotaryDim uint32, ropeBase float32, qOut []T) error {
	return RopeKVAppendTyped(dtype, dtype, pages, q, numQHeads, k, v, blockIDs, offsets, positions, rotaryDim, ropeBase, qOut,
		AppendOptions{})
}

// RopeKVAppendTyped is RopeKVAppend into pages of cacheDType, as
// KVAppendTyped (the rotated K quantised from its FP32 value), in the RoPE
// convention opt.RopeStyle (RopeKVAppend: split-half); q and qOut are of
// dtype.
func RopeKVAppendTyped[T, S Elem](dtype, cacheDType DType, pages KVPages[S], q []T, numQHeads uint32, k, v []T,
	blockIDs, offsets, positions []int32, rotaryDim uint32, ropeBase float32, qOut []T, opt AppendOptions) error {
	p, err := appendShape(dtype, cacheDType, pages, k, v, blockIDs, offsets, opt)
	if err != nil {
		return err
	}
	n := len(blockIDs)
	if len(positions) != n {
		return invalid("positions: expected %d entries (one per token), got %d", n, len(positions))
	}
	want, ok := elemCount(n, int(numQHeads), int(pages.HeadDim))
	if !ok {
		return invalid("q/q_out: %d x %d x %d elements overflow", n, numQHeads, pages.HeadDim)
	}
	if len(q) != want || len(qOut) != want {
		return invalid("q/q_out: expected %d elements, got %d and %d", want, len(q), len(qOut))
	}
	p.num_q_heads, p.rotary_dim, p.rope_base = C.uint32_t(numQHeads), C.uint32_t(rotaryDim), C.float(ropeBase)
	p.rope_style = C.int32_t(opt.RopeStyle)
	err = call(func() C.fd_status {
		return C.fdgo_kv_append(1, &p, dataPtr(q), dataPtr(qOut), dataPtr(k), dataPtr(v), dataPtr(pages.K), dataPtr(pages.V),
			i32Ptr(blockIDs), i32Ptr(offsets), i32Ptr(positions))
	})
	runtime.KeepAlive(q)
	runtime.KeepAlive(qOut)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	runtime.KeepAlive(pages.K)
	runtime.KeepAlive(pages.V)
	runtime.KeepAlive(blockIDs)
	runtime.KeepAlive(offsets)
	runtime.KeepAlive(positions)
	return err
}
