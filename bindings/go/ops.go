package flashdec

/*
#include <stdlib.h>
#include <string.h>
#include "flashdec.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// cgo forbids handing C a Go struct that holds Go pointers, and
// fd_decode_params holds pointers to q, out, tables and lens. So decode
// stages those buffers in C memory (one copy each way); K/V stay in place.
type cArena struct{ ptrs []unsafe.Pointer }

func (a *cArena) alloc(bytes int) unsafe.Pointer {
	if bytes == 0 {
		bytes = 1
	}
	p := C.calloc(1, C.size_t(bytes))
	if p == nil {
		panic("flashdec: C.calloc failed")
	}
	a.ptrs = append(a.ptrs, p)
	return p
}

func (a *cArena) copyIn(src unsafe.Pointer, bytes int) unsafe.Pointer {
	p := a.alloc(bytes)
	if bytes > 0 {
		C.memcpy(p, src, C.size_t(bytes))
	}
	return p
}

func (a *cArena) free() {
	for _, p := range a.ptrs {
		C.free(p)
	}
}

// DecodeOptions are the optional knobs of a decode call.
type DecodeOptions struct {
	SmScale    float32 // 0: 1/sqrt(head_dim)
	NumSplits  int32   // 0 automatic, 1 none
	CPUThreads uint32  // 0: all hardware threads
}

func decodeCall[T Elem](dtype DType, q []T, numQHeads, numKVHeads, headDim, blockSize, numBlocks uint32, layout Layout,
	k, v unsafe.Pointer, strides [4]int64, tables, lens []int32, out []T, opt DecodeOptions) error {
	batch := len(lens)
	if batch == 0 {
		return invalid("seq_lens: batch must be at least 1")
	}
	if !fitsU32(batch) {
		return invalid("seq_lens: batch %d does not fit in uint32", batch)
	}
	qElems, ok := elemCount(batch, int(numQHeads), int(headDim))
	if !ok {
		return invalid("q/out: %d x %d x %d elements overflow", batch, numQHeads, headDim)
	}
	if len(q) != qElems || len(out) != qElems {
		return invalid("q/out: expected %d elements (%d x %d x %d), got %d and %d", qElems, batch, numQHeads, headDim, len(q), len(out))
	}
	if len(tables) == 0 || len(tables)%batch != 0 {
		return invalid("block_tables: %d entries is not a positive multiple of batch %d", len(tables), batch)
	}
	if !fitsU32(len(tables) / batch) {
		return invalid("block_tables: %d entries per row do not fit in uint32", len(tables)/batch)
	}
	var a cArena
	defer a.free()
	es := elemSize[T]()
	p := (*C.fd_decode_params)(a.alloc(int(unsafe.Sizeof(C.fd_decode_params{}))))
	C.fd_decode_params_init(p)
	p.dtype = C.int32_t(dtype)
	p.batch, p.num_q_heads, p.num_kv_heads, p.head_dim = C.uint32_t(batch), C.uint32_t(numQHeads), C.uint32_t(numKVHeads), C.uint32_t(headDim)
	p.block_size, p.num_blocks = C.uint32_t(blockSize), C.uint32_t(numBlocks)
	p.max_blocks_per_seq = C.uint32_t(len(tables) / batch)
	p.layout = C.int32_t(layout)
	p.sm_scale, p.num_splits, p.cpu_threads = C.float(opt.SmScale), C.int32_t(opt.NumSplits), C.uint32_t(opt.CPUThreads)
	p.q = a.copyIn(unsafe.Pointer(&q[0]), qElems*es)
	p.k_cache, p.v_cache = k, v
	p.stride_block, p.stride_head, p.stride_token, p.stride_dim = C.int64_t(strides[0]), C.int64_t(strides[1]), C.int64_t(strides[2]), C.int64_t(strides[3])
	p.block_tables = (*C.int32_t)(a.copyIn(unsafe.Pointer(&tables[0]), len(tables)*4))
	p.seq_lens = (*C.int32_t)(a.copyIn(unsafe.Pointer(&lens[0]), batch*4))
	outC := a.alloc(qElems * es)
	p.out = outC
	return decodeFinish(p, &a, outC, unsafe.Pointer(&out[0]), qElems*es)
}

func decodeFinish(p *C.fd_decode_params, a *cArena, outC, outGo unsafe.Pointer, bytes int) error {
	var size C.size_t
	if err := call(func() C.fd_status { return C.fd_decode_workspace_size(p, &size) }); err != nil {
		return err
	}
	if size > 0 {
		p.workspace, p.workspace_size = a.alloc(int(size)), size
	}
	if err := call(func() C.fd_status { return C.fd_decode(p) }); err != nil {
		return err
	}
	C.memcpy(outGo, outC, C.size_t(bytes))
	return nil
}

// DecodeLayer runs paged decode attention of q ([rows, numQHeads, head_dim])
// over layer `layer` of a CPU cache with the given block tables and seq_lens.
func DecodeLayer[T Elem](c *Cache, layer uint32, q []T, numQHeads uint32, tables, lens []int32, out []T, opt DecodeOptions) error {
	if err := checkElem[T](c.cfg.DType, "q"); err != nil {
		return err
	}
	if c.cfg.DeviceType != 0 {
		return invalid("DecodeLayer needs a CPU cache")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle()
	if err != nil {
		return err
	}
	var k, v unsafe.Pointer
	var strides [4]int64
	if err := call(func() C.fd_status {
		return C.fd_cache_layer_storage(h, C.uint32_t(layer), &k, &v, (*C.int64_t)(unsafe.Pointer(&strides[0])))
	}); err != nil {
		return err
	}
	err = decodeCall(c.cfg.DType, q, numQHeads, c.cfg.NumKVHeads, c.cfg.HeadDim, c.cfg.BlockSize, c.cfg.MaxBlocks,
		c.cfg.Layout, k, v, strides, tables, lens, out, opt)
	runtime.KeepAlive(c)
	return err
}

// Decode runs paged decode attention over host slices: k and v packed in
// `layout` ([num_blocks, num_kv_heads, block_size, head_dim] for token-major).
func Decode[T Elem](dtype DType, q []T, numQHeads uint32, k, v []T, numKVHeads, headDim, blockSize uint32, layout Layout,
	tables, lens []int32, out []T, opt DecodeOptions) error {
	if err := checkElem[T](dtype, "q"); err != nil {
		return err
	}
	// int arithmetic: the uint32 product used to wrap, so a short k could pass
	// for many huge blocks.
	block, ok := elemCount(int(numKVHeads), int(blockSize), int(headDim))
	if !ok {
		return invalid("k/v: a block of %d x %d x %d elements overflows", numKVHeads, blockSize, headDim)
	}
	if block == 0 || len(k) == 0 || len(k)%block != 0 || len(v) != len(k) {
		return invalid("k/v: need equal positive multiples of a block (%d elements), got %d and %d", block, len(k), len(v))
	}
	if !fitsU32(len(k) / block) {
		return invalid("k/v: %d blocks do not fit in uint32", len(k)/block)
	}
	var a cArena
	defer a.free()
	es := elemSize[T]()
	kc := a.copyIn(unsafe.Pointer(&k[0]), len(k)*es)
	vc := a.copyIn(unsafe.Pointer(&v[0]), len(v)*es)
	return decodeCall(dtype, q, numQHeads, numKVHeads, headDim, blockSize, uint32(len(k)/block), layout, kc, vc, [4]int64{}, tables, lens, out, opt)
}

// RopeApply rotates x ([len(positions), numHeads, headDim]) in place.
func RopeApply[T Elem](dtype DType, x []T, numHeads, headDim uint32, positions []int32, rotaryDim uint32, ropeBase float32) error {
	if err := checkElem[T](dtype, "x"); err != nil {
		return err
	}
	if !fitsU32(len(positions)) {
		return invalid("positions: %d tokens do not fit in uint32", len(positions))
	}
	want, ok := elemCount(len(positions), int(numHeads), int(headDim))
	if !ok {
		return invalid("x: %d x %d x %d elements overflow", len(positions), numHeads, headDim)
	}
	if len(x) != want {
		return invalid("x: expected %d elements, got %d", want, len(x))
	}
	err := call(func() C.fd_status {
		return C.fd_rope_apply(C.int32_t(dtype), dataPtr(x), C.uint32_t(len(positions)), C.uint32_t(numHeads), C.uint32_t(headDim),
			i32Ptr(positions), C.uint32_t(rotaryDim), C.float(ropeBase))
	})
	runtime.KeepAlive(x)
	runtime.KeepAlive(positions)
	return err
}

// ReferenceAttentionDense: q [batch, hq, d], k/v [batch, hkv, maxSeqLen, d].
func ReferenceAttentionDense[T Elem](dtype DType, q []T, numQHeads uint32, k, v []T, numKVHeads, headDim uint32, lens []int32, smScale float32, out []T) error {
	if err := checkElem[T](dtype, "q"); err != nil {
		return err
	}
	batch := len(lens)
	if !fitsU32(batch) {
		return invalid("seq_lens: batch %d does not fit in uint32", batch)
	}
	perRow, ok := elemCount(batch, int(numKVHeads), int(headDim))
	if !ok {
		return invalid("k/v: %d x %d x %d elements per token overflow", batch, numKVHeads, headDim)
	}
	if perRow == 0 || len(k)%perRow != 0 || len(v) != len(k) {
		return invalid("k/v: %d and %d elements do not form [batch, num_kv_heads, max_seq_len, head_dim]", len(k), len(v))
	}
	if !fitsU32(len(k) / perRow) {
		return invalid("k/v: max_seq_len %d does not fit in uint32", len(k)/perRow)
	}
	want, ok := elemCount(batch, int(numQHeads), int(headDim))
	if !ok {
		return invalid("q/out: %d x %d x %d elements overflow", batch, numQHeads, headDim)
	}
	if len(q) != want || len(out) != want {
		return invalid("q/out: expected %d elements, got %d and %d", want, len(q), len(out))
	}
	err := call(func() C.fd_status {
		return C.fd_reference_attention_dense(C.int32_t(dtype), C.uint32_t(batch), C.uint32_t(numQHeads), C.uint32_t(numKVHeads),
			C.uint32_t(headDim), C.uint32_t(len(k)/perRow), dataPtr(q), dataPtr(k), dataPtr(v), i32Ptr(lens), C.float(smScale), dataPtr(out))
	})
	runtime.KeepAlive(q)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	runtime.KeepAlive(lens)
	runtime.KeepAlive(out)
	return err
}
