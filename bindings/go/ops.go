package flashdec

/*
#include <stdlib.h>
#include <string.h>
#include "flashdec.h"
*/
import "C"

import (
	"fmt"
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

// DecodeOptions are the optional knobs of a decode call (and of a plan).
type DecodeOptions struct {
	SmScale       float32 // 0: 1/sqrt(head_dim)
	NumSplits     int32   // 0 automatic, 1 none
	CPUThreads    uint32  // 0: all hardware threads
	MaxSeqLenHint int32   // upper bound of lens (0: max_blocks_per_seq*block_size)
	// MaxQLenHint bounds the query tokens per row (0: no bound given); a
	// longer row of QIndptr is InvalidArgument. (The library's CUDA backend
	// needs it with q_indptr; the Go calls here run on the CPU.)
	MaxQLenHint int32
	// QIndptr is fd_decode_params.q_indptr, multi-token queries:
	// len(lens)+1 offsets into q, QIndptr[0] = 0; row r's query
	// tokens are q's tokens QIndptr[r] .. QIndptr[r+1]-1, at least one and
	// at most lens[r]. They are the row's last tokens, and attention is
	// causal: query j of a row of n sees K/V positions 0 .. lens[r]-n+j.
	// q and out then hold QIndptr[len(lens)] tokens. Lengths are checked by
	// the binding (InvalidArgument naming q_indptr, q or out), the offsets by
	// the library (InvalidArgument naming the row). nil: one query token per
	// row. One token per row through QIndptr gives the bits of nil.
	QIndptr []int32
	// KScale and VScale dequantise the stored K/V (fd_decode_params.k_scale
	// / v_scale, docs/semantics.md S1.1): attention reads K as stored x
	// KScale and V as stored x VScale, for any K/V type. 0: 1 (DecodeLayer:
	// the layer's current scale, Cache.KVScales). Otherwise finite and > 0,
	// else the library's InvalidArgument naming the field. Not planned: see
	// RunDecodePlanScaled.
	KScale, VScale float32
	// Attention variants (fd_decode_params, docs/semantics.md S2.3), each off
	// by default and combinable; the library checks the values
	// (InvalidArgument naming the field). Not planned: a plan's runs may
	// take others (RunDecodePlanWith), so layers may alternate windows.
	//
	// LogitSoftcap: scores become cap*tanh(s/cap); 0: none (finite, >= 0).
	LogitSoftcap float32
	// SlidingWindow: a query at position p sees p-w+1 .. p only; 0: none.
	SlidingWindow int32
	// Sinks: numQHeads sink logits joining each head's softmax denominator,
	// staged in C memory like q (-inf: none for that head; NaN is refused
	// naming the entry); nil: none. Another length is InvalidArgument
	// naming sinks, from the binding.
	Sinks []float32
}

// checkSinks checks that sinks (nil: none) has one logit per query head.
func checkSinks(sinks []float32, numQHeads uint32) error {
	if sinks != nil && len(sinks) != int(numQHeads) {
		return invalid("sinks: expected %d entries (num_q_heads), got %d", numQHeads, len(sinks))
	}
	return nil
}

// fillVariants sets p's attention variants, staging the sinks in a (checked
// with checkSinks first).
func fillVariants(a *cArena, p *C.fd_decode_params, opt DecodeOptions) {
	p.logit_softcap, p.sliding_window = C.float(opt.LogitSoftcap), C.int32_t(opt.SlidingWindow)
	if len(opt.Sinks) > 0 {
		p.sinks = (*C.float)(a.copyIn(unsafe.Pointer(&opt.Sinks[0]), len(opt.Sinks)*4))
	}
}

// clone is opt with its own copies of the slices (a plan keeps one).
func (opt DecodeOptions) clone() DecodeOptions {
	if opt.QIndptr != nil {
		opt.QIndptr = append([]int32{}, opt.QIndptr...)
	}
	if opt.Sinks != nil {
		opt.Sinks = append([]float32{}, opt.Sinks...)
	}
	return opt
}

// orOne is a scale option with 0 meaning 1.
func orOne(x float32) float32 {
	if x == 0 {
		return 1
	}
	return x
}

// DecodeDTypes are the element types of a decode call: fd_decode_params
// q_dtype, kv_dtype and out_dtype. The CPU backend serves Q and Out each
// F32, F16 or BF16 over KV of any type (F32, F16, BF16, FP8E4M3, FP8E5M2 as
// uint8 bits); CUDA what its kernels do. Any other combination is
// Unsupported (an FP8 Q or Out: InvalidArgument), with a message naming the
// field.
type DecodeDTypes struct{ Q, KV, Out DType }

// SameDTypes is q, K/V and out all of dtype (what Decode takes).
func SameDTypes(dtype DType) DecodeDTypes { return DecodeDTypes{Q: dtype, KV: dtype, Out: dtype} }

func checkDTypes[Q, KV, O Elem](dt DecodeDTypes) error {
	if err := checkElem[Q](dt.Q, "q"); err != nil {
		return err
	}
	if err := checkElem[KV](dt.KV, "k/v"); err != nil {
		return err
	}
	return checkElem[O](dt.Out, "out")
}

// decodeGeom is a call's K/V view and head shape; k and v are C memory.
type decodeGeom struct {
	numQHeads, numKVHeads, headDim, blockSize, numBlocks uint32
	layout                                               Layout
	k, v                                                 unsafe.Pointer
	strides                                              [4]int64
}

// fillDecodeShape sets everything of p but the buffers: the planned part.
func fillDecodeShape(p *C.fd_decode_params, dt DecodeDTypes, batch, maxBlocksPerSeq uint32, g decodeGeom, opt DecodeOptions) {
	C.fd_decode_params_init(p)
	p.batch, p.num_q_heads, p.num_kv_heads, p.head_dim = C.uint32_t(batch), C.uint32_t(g.numQHeads), C.uint32_t(g.numKVHeads), C.uint32_t(g.headDim)
	p.q_dtype, p.kv_dtype, p.out_dtype = C.int32_t(dt.Q), C.int32_t(dt.KV), C.int32_t(dt.Out)
	p.layout = C.int32_t(g.layout)
	p.block_size, p.num_blocks, p.max_blocks_per_seq = C.uint32_t(g.blockSize), C.uint32_t(g.numBlocks), C.uint32_t(maxBlocksPerSeq)
	p.stride_block, p.stride_head, p.stride_token, p.stride_dim = C.int64_t(g.strides[0]), C.int64_t(g.strides[1]), C.int64_t(g.strides[2]), C.int64_t(g.strides[3])
	p.sm_scale = C.float(opt.SmScale)
	p.k_scale, p.v_scale = C.float(orOne(opt.KScale)), C.float(orOne(opt.VScale))
	p.max_seq_len_hint, p.max_q_len_hint = C.int32_t(opt.MaxSeqLenHint), C.int32_t(opt.MaxQLenHint)
	p.num_splits, p.cpu_threads = C.int32_t(opt.NumSplits), C.uint32_t(opt.CPUThreads)
}

// decodeCall checks the slices, stages q, tables, lens (and q_indptr) in C
// memory and runs fd_decode, or fd_decode_run with plan when it is not nil.
// The K/V are g's C memory already, of dt.KV (the callers check their Go
// type where they had one).
func decodeCall[Q, O Elem](dt DecodeDTypes, q []Q, g decodeGeom, tables, lens []int32, out []O, opt DecodeOptions,
	plan *C.fd_decode_plan) error {
	if err := checkElem[Q](dt.Q, "q"); err != nil {
		return err
	}
	if err := checkElem[O](dt.Out, "out"); err != nil {
		return err
	}
	batch := len(lens)
	if batch == 0 {
		return invalid("seq_lens: batch must be at least 1")
	}
	if !fitsU32(batch) {
		return invalid("seq_lens: batch %d does not fit in uint32", batch)
	}
	tokens, err := queryTokens(opt.QIndptr, batch)
	if err != nil {
		return err
	}
	if err := checkSinks(opt.Sinks, g.numQHeads); err != nil {
		return err
	}
	rows := fmt.Sprint(batch)
	if opt.QIndptr != nil {
		rows = fmt.Sprintf("%d query tokens (q_indptr[%d])", tokens, batch)
	}
	qElems, ok := elemCount(tokens, int(g.numQHeads), int(g.headDim))
	if !ok {
		return invalid("q/out: %d x %d x %d elements overflow", tokens, g.numQHeads, g.headDim)
	}
	if len(q) != qElems || len(out) != qElems {
		return invalid("q/out: expected %d elements (%s x %d x %d), got %d and %d", qElems, rows, g.numQHeads, g.headDim, len(q), len(out))
	}
	if len(tables) == 0 || len(tables)%batch != 0 {
		return invalid("block_tables: %d entries is not a positive multiple of batch %d", len(tables), batch)
	}
	if !fitsU32(len(tables) / batch) {
		return invalid("block_tables: %d entries per row do not fit in uint32", len(tables)/batch)
	}
	var a cArena
	defer a.free()
	p := (*C.fd_decode_params)(a.alloc(int(unsafe.Sizeof(C.fd_decode_params{}))))
	fillDecodeShape(p, dt, uint32(batch), uint32(len(tables)/batch), g, opt)
	fillVariants(&a, p, opt)
	p.q = a.copyIn(dataPtr(q), qElems*elemSize[Q]())
	p.k_cache, p.v_cache = g.k, g.v
	p.block_tables = (*C.int32_t)(a.copyIn(unsafe.Pointer(&tables[0]), len(tables)*4))
	p.seq_lens = (*C.int32_t)(a.copyIn(unsafe.Pointer(&lens[0]), batch*4))
	if opt.QIndptr != nil {
		p.q_indptr = (*C.int32_t)(a.copyIn(unsafe.Pointer(&opt.QIndptr[0]), len(opt.QIndptr)*4))
	}
	outBytes := qElems * elemSize[O]()
	outC := a.alloc(outBytes)
	p.out = outC
	var size C.size_t
	if err := call(func() C.fd_status {
		if plan != nil {
			return C.fd_decode_plan_workspace_size(plan, &size)
		}
		return C.fd_decode_workspace_size(p, &size)
	}); err != nil {
		return err
	}
	if size > 0 {
		p.workspace, p.workspace_size = a.alloc(int(size)), size
	}
	if err := call(func() C.fd_status {
		if plan != nil {
			return C.fd_decode_run(plan, p)
		}
		return C.fd_decode(p)
	}); err != nil {
		return err
	}
	if outBytes > 0 {
		C.memcpy(dataPtr(out), outC, C.size_t(outBytes))
	}
	return nil
}

// queryTokens is the query tokens of batch rows: one per row (qIndptr nil),
// or qIndptr[batch] (the extent the library reads; it checks the offsets
// lie within it).
func queryTokens(qIndptr []int32, batch int) (int, error) {
	if qIndptr == nil {
		return batch, nil
	}
	if len(qIndptr) != batch+1 {
		return 0, invalid("q_indptr: expected %d entries (batch + 1), got %d", batch+1, len(qIndptr))
	}
	if qIndptr[batch] < 0 {
		return 0, invalid("q_indptr: q_indptr[%d] = %d query tokens in all is negative", batch, qIndptr[batch])
	}
	return int(qIndptr[batch]), nil
}

// DecodeLayer runs paged decode attention of q ([rows, numQHeads, head_dim],
// or [opt.QIndptr[rows], ...] with multi-token queries) over layer `layer` of
// a CPU cache with the given block tables and seq_lens. q and out have the
// cache's input type (ResolvedInputDType: its DType, or what an FP8 cache
// takes); the K/V are read with the layer's scales unless opt gives them.
func DecodeLayer[T Elem](c *Cache, layer uint32, q []T, numQHeads uint32, tables, lens []int32, out []T, opt DecodeOptions) error {
	if c.cfg.DeviceType != 0 {
		return invalid("DecodeLayer needs a CPU cache")
	}
	if opt.KScale == 0 || opt.VScale == 0 {
		ks, vs, err := c.KVScales()
		if err != nil {
			return err
		}
		if layer >= c.cfg.NumLayers {
			return invalid("layer %d out of range [0, %d)", layer, c.cfg.NumLayers)
		}
		if opt.KScale == 0 {
			opt.KScale = ks[layer]
		}
		if opt.VScale == 0 {
			opt.VScale = vs[layer]
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle()
	if err != nil {
		return err
	}
	g := decodeGeom{numQHeads: numQHeads, numKVHeads: c.cfg.NumKVHeads, headDim: c.cfg.HeadDim, blockSize: c.cfg.BlockSize,
		numBlocks: c.cfg.MaxBlocks, layout: c.cfg.Layout}
	if err := call(func() C.fd_status {
		return C.fd_cache_layer_storage(h, C.uint32_t(layer), &g.k, &g.v, (*C.int64_t)(unsafe.Pointer(&g.strides[0])))
	}); err != nil {
		return err
	}
	in := c.cfg.ResolvedInputDType()
	err = decodeCall[T, T](DecodeDTypes{Q: in, KV: c.cfg.DType, Out: in}, q, g, tables, lens, out, opt, nil)
	runtime.KeepAlive(c)
	return err
}

// hostKV stages packed host K/V ([num_blocks, num_kv_heads, block_size,
// head_dim] for token-major) in C memory owned by a.
func hostKV[KV Elem](a *cArena, k, v []KV, numQHeads, numKVHeads, headDim, blockSize uint32, layout Layout) (decodeGeom, error) {
	// int arithmetic: the uint32 product used to wrap, so a short k could pass
	// for many huge blocks.
	block, ok := elemCount(int(numKVHeads), int(blockSize), int(headDim))
	if !ok {
		return decodeGeom{}, invalid("k/v: a block of %d x %d x %d elements overflows", numKVHeads, blockSize, headDim)
	}
	if block == 0 || len(k) == 0 || len(k)%block != 0 || len(v) != len(k) {
		return decodeGeom{}, invalid("k/v: need equal positive multiples of a block (%d elements), got %d and %d", block, len(k), len(v))
	}
	if !fitsU32(len(k) / block) {
		return decodeGeom{}, invalid("k/v: %d blocks do not fit in uint32", len(k)/block)
	}
	es := elemSize[KV]()
	return decodeGeom{numQHeads: numQHeads, numKVHeads: numKVHeads, headDim: headDim, blockSize: blockSize,
		numBlocks: uint32(len(k) / block), layout: layout,
		k: a.copyIn(unsafe.Pointer(&k[0]), len(k)*es), v: a.copyIn(unsafe.Pointer(&v[0]), len(v)*es)}, nil
}

// Decode runs paged decode attention over host slices: k and v packed in
// `layout` ([num_blocks, num_kv_heads, block_size, head_dim] for token-major),
// with q, K/V and out all of dtype. q and out are [len(lens), numQHeads,
// headDim] (one query token per row), or [opt.QIndptr[len(lens)], numQHeads,
// headDim] with multi-token queries (see DecodeOptions.QIndptr).
func Decode[T Elem](dtype DType, q []T, numQHeads uint32, k, v []T, numKVHeads, headDim, blockSize uint32, layout Layout,
	tables, lens []int32, out []T, opt DecodeOptions) error {
	return DecodeTyped(SameDTypes(dtype), q, numQHeads, k, v, numKVHeads, headDim, blockSize, layout, tables, lens, out, opt)
}

// DecodeTyped is Decode with an element type each for q, K/V and out.
func DecodeTyped[Q, KV, O Elem](dt DecodeDTypes, q []Q, numQHeads uint32, k, v []KV, numKVHeads, headDim, blockSize uint32,
	layout Layout, tables, lens []int32, out []O, opt DecodeOptions) error {
	if err := checkDTypes[Q, KV, O](dt); err != nil {
		return err
	}
	var a cArena
	defer a.free()
	g, err := hostKV(&a, k, v, numQHeads, numKVHeads, headDim, blockSize, layout)
	if err != nil {
		return err
	}
	return decodeCall[Q, O](dt, q, g, tables, lens, out, opt, nil)
}

// DecodeShape is what a DecodePlan fixes of the calls it runs: the shape,
// element types and packed K/V layout (host slices, see Decode).
type DecodeShape struct {
	DTypes                                DecodeDTypes
	Batch, NumQHeads, NumKVHeads, HeadDim uint32
	BlockSize, NumBlocks, MaxBlocksPerSeq uint32
	Layout                                Layout
}

// DecodePlan is a decode plan (fd_decode_plan): the split-KV work list of
// one step, made once on the host and used by every layer's RunDecodePlan.
// Immutable and safe to share between goroutines. Close it when done (a
// finalizer is only a backstop).
type DecodePlan struct {
	h     *C.fd_decode_plan
	shape DecodeShape
	opt   DecodeOptions
}

// NewDecodePlan plans the calls of one step with this shape and these
// options (fd_decode_plan_create). With hostSeqLens (the step's exact K/V
// lengths, one per row) the split-KV layout is chosen from them; with nil,
// from opt.MaxSeqLenHint, as Decode does. opt.QIndptr (multi-token queries,
// copied into the plan) is the step's: every RunDecodePlan uses it. The
// attention variants (LogitSoftcap, SlidingWindow, Sinks, copied) are the
// runs' default; SlidingWindow also sizes the split layout (only visible
// tokens count), while a run with a longer window, or none, is still exact.
func NewDecodePlan(shape DecodeShape, hostSeqLens []int32, opt DecodeOptions) (*DecodePlan, error) {
	if hostSeqLens != nil && len(hostSeqLens) != int(shape.Batch) {
		return nil, invalid("host_seq_lens: expected %d entries (batch), got %d", shape.Batch, len(hostSeqLens))
	}
	if opt.QIndptr != nil && len(opt.QIndptr) != int(shape.Batch)+1 {
		return nil, invalid("q_indptr: expected %d entries (batch + 1), got %d", shape.Batch+1, len(opt.QIndptr))
	}
	if err := checkSinks(opt.Sinks, shape.NumQHeads); err != nil {
		return nil, err
	}
	opt = opt.clone() // the plan's own copies of QIndptr and Sinks
	var a cArena
	defer a.free()
	p := (*C.fd_decode_params)(a.alloc(int(unsafe.Sizeof(C.fd_decode_params{}))))
	g := decodeGeom{numQHeads: shape.NumQHeads, numKVHeads: shape.NumKVHeads, headDim: shape.HeadDim, blockSize: shape.BlockSize,
		numBlocks: shape.NumBlocks, layout: shape.Layout}
	fillDecodeShape(p, shape.DTypes, shape.Batch, shape.MaxBlocksPerSeq, g, opt)
	fillVariants(&a, p, opt)
	if opt.QIndptr != nil {
		p.q_indptr = (*C.int32_t)(a.copyIn(unsafe.Pointer(&opt.QIndptr[0]), len(opt.QIndptr)*4))
	}
	var lens *C.int32_t
	if len(hostSeqLens) > 0 {
		lens = (*C.int32_t)(a.copyIn(unsafe.Pointer(&hostSeqLens[0]), len(hostSeqLens)*4))
	}
	var h *C.fd_decode_plan
	if err := call(func() C.fd_status { return C.fd_decode_plan_create(p, lens, &h) }); err != nil {
		return nil, err
	}
	plan := &DecodePlan{h: h, shape: shape, opt: opt}
	runtime.SetFinalizer(plan, (*DecodePlan).Close)
	return plan, nil
}

// Close destroys the plan; idempotent.
func (p *DecodePlan) Close() {
	if p.h != nil {
		C.fd_decode_plan_destroy(p.h)
		p.h = nil
	}
	runtime.SetFinalizer(p, nil)
}

func (p *DecodePlan) handle() (*C.fd_decode_plan, error) {
	if p == nil || p.h == nil {
		return nil, closedError("decode plan")
	}
	return p.h, nil
}

// Shape is the shape the plan was made for.
func (p *DecodePlan) Shape() DecodeShape { return p.shape }

// Options is a copy of the options the plan was made with, which
// RunDecodePlan uses: change a field and pass it to RunDecodePlanWith.
func (p *DecodePlan) Options() DecodeOptions { return p.opt.clone() }

// WorkspaceSize is the scratch every run with the plan needs
// (fd_decode_plan_workspace_size); RunDecodePlan allocates it itself.
func (p *DecodePlan) WorkspaceSize() (int, error) {
	h, err := p.handle()
	if err != nil {
		return 0, err
	}
	var size C.size_t
	err = call(func() C.fd_status { return C.fd_decode_plan_workspace_size(h, &size) })
	runtime.KeepAlive(p)
	return int(size), err
}

// RunDecodePlan runs one decode call with plan (fd_decode_run) over host
// slices, as Decode does, with the plan's element types and options (q and
// out of QIndptr[Batch] tokens for a plan made with QIndptr). The
// slices must give the planned shape: a call that differs in a planned field
// (for example more K/V blocks than planned) is refused with InvalidArgument
// naming the field.
func RunDecodePlan[Q, KV, O Elem](plan *DecodePlan, q []Q, k, v []KV, tables, lens []int32, out []O) error {
	if plan == nil {
		return closedError("decode plan")
	}
	return runDecodePlan(plan, plan.opt, q, k, v, tables, lens, out)
}

// RunDecodePlanScaled is RunDecodePlan with this run's K/V dequantisation
// scales (0: 1) instead of the plan's options': scales are not planned, and
// each layer of an FP8 cache has its own.
func RunDecodePlanScaled[Q, KV, O Elem](plan *DecodePlan, kScale, vScale float32, q []Q, k, v []KV, tables, lens []int32, out []O) error {
	if plan == nil {
		return closedError("decode plan")
	}
	opt := plan.opt
	opt.KScale, opt.VScale = kScale, vScale
	return runDecodePlan(plan, opt, q, k, v, tables, lens, out)
}

// RunDecodePlanWith is RunDecodePlan with this run's options instead of the
// plan's (start from plan.Options()). The library takes from each run all
// but the planned fields: SmScale, CPUThreads, MaxSeqLenHint, the K/V
// scales, QIndptr's entries and the attention variants (LogitSoftcap,
// SlidingWindow, Sinks) may differ per run (NumSplits is the plan's); a
// different MaxQLenHint is planned, so refused (InvalidArgument naming it).
func RunDecodePlanWith[Q, KV, O Elem](plan *DecodePlan, opt DecodeOptions, q []Q, k, v []KV, tables, lens []int32, out []O) error {
	return runDecodePlan(plan, opt, q, k, v, tables, lens, out)
}

// runDecodePlan runs plan with opt.
func runDecodePlan[Q, KV, O Elem](plan *DecodePlan, opt DecodeOptions, q []Q, k, v []KV, tables, lens []int32, out []O) error {
	h, err := plan.handle()
	if err != nil {
		return err
	}
	s := plan.shape
	if err := checkDTypes[Q, KV, O](s.DTypes); err != nil {
		return err
	}
	var a cArena
	defer a.free()
	g, err := hostKV(&a, k, v, s.NumQHeads, s.NumKVHeads, s.HeadDim, s.BlockSize, s.Layout)
	if err != nil {
		return err
	}
	err = decodeCall[Q, O](s.DTypes, q, g, tables, lens, out, opt, h)
	runtime.KeepAlive(plan)
	return err
}

// RopeApply rotates x ([len(positions), numHeads, headDim]) in place,
// split-half (fd_rope_apply); RopeApplyStyle takes the convention.
func RopeApply[T Elem](dtype DType, x []T, numHeads, headDim uint32, positions []int32, rotaryDim uint32, ropeBase float32) error {
	if err := checkRope[T](dtype, x, numHeads, headDim, positions); err != nil {
		return err
	}
	err := call(func() C.fd_status {
		return C.fd_rope_apply(C.int32_t(dtype), dataPtr(x), C.uint32_t(len(positions)), C.uint32_t(numHeads), C.uint32_t(headDim),
			i32Ptr(positions), C.uint32_t(rotaryDim), C.float(ropeBase))
	})
	runtime.KeepAlive(x)
	runtime.KeepAlive(positions)
	return err
}

// RopeApplyStyle is RopeApply in the RoPE convention style
// (fd_rope_apply_style): RopeSplitHalf gives RopeApply's bits,
// RopeInterleaved rotates the pairs (2i, 2i + 1). Dims from rotaryDim on stay
// unchanged in either style; an unknown style is the library's
// InvalidArgument naming rope_style, with nothing written.
func RopeApplyStyle[T Elem](dtype DType, x []T, numHeads, headDim uint32, positions []int32, rotaryDim uint32, ropeBase float32,
	style RopeStyle) error {
	if err := checkRope[T](dtype, x, numHeads, headDim, positions); err != nil {
		return err
	}
	err := call(func() C.fd_status {
		return C.fd_rope_apply_style(C.int32_t(dtype), dataPtr(x), C.uint32_t(len(positions)), C.uint32_t(numHeads),
			C.uint32_t(headDim), i32Ptr(positions), C.uint32_t(rotaryDim), C.float(ropeBase), C.int32_t(style))
	})
	runtime.KeepAlive(x)
	runtime.KeepAlive(positions)
	return err
}

// checkRope checks x against [len(positions), numHeads, headDim].
func checkRope[T Elem](dtype DType, x []T, numHeads, headDim uint32, positions []int32) error {
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
	return nil
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

// ReferenceOptions are the optional parts of ReferenceAttention: the scale,
// the query tokens and the attention variants of fd_reference_params.
type ReferenceOptions struct {
	SmScale      float32 // 0: 1/sqrt(head_dim)
	LogitSoftcap float32 // scores become cap*tanh(s/cap); 0: none
	// SlidingWindow: a query at position p sees p-w+1 .. p only; 0: none.
	SlidingWindow int32
	// Sinks: numQHeads sink logits joining each head's softmax denominator; nil: none.
	Sinks []float32
	// QIndptr: len(lens)+1 query-token offsets as DecodeOptions.QIndptr
	// (causal, a row's queries are its last tokens); nil: one per row.
	QIndptr []int32
}

// ReferenceAttention is the dense CPU reference with query tokens and
// variants (fd_reference_attention): q and out [tokens, numQHeads, headDim]
// with tokens = len(lens), or opt.QIndptr[len(lens)]; k and v [len(lens),
// numKVHeads, maxSeqLen, headDim]. Lengths are checked here, values by the
// library (InvalidArgument naming the field).
func ReferenceAttention[T Elem](dtype DType, q []T, numQHeads uint32, k, v []T, numKVHeads, headDim uint32, lens []int32, out []T,
	opt ReferenceOptions) error {
	if err := checkElem[T](dtype, "q"); err != nil {
		return err
	}
	batch := len(lens)
	if batch == 0 || !fitsU32(batch) {
		return invalid("seq_lens: batch %d must be at least 1 and fit in uint32", batch)
	}
	tokens, err := queryTokens(opt.QIndptr, batch)
	if err != nil {
		return err
	}
	perRow, ok := elemCount(batch, int(numKVHeads), int(headDim))
	if !ok || perRow == 0 || len(k)%perRow != 0 || len(v) != len(k) || !fitsU32(len(k)/perRow) {
		return invalid("k/v: %d and %d elements do not form [batch, num_kv_heads, max_seq_len, head_dim]", len(k), len(v))
	}
	want, ok := elemCount(tokens, int(numQHeads), int(headDim))
	if !ok {
		return invalid("q/out: %d x %d x %d elements overflow", tokens, numQHeads, headDim)
	}
	if len(q) != want || len(out) != want {
		return invalid("q/out: expected %d elements (%d query tokens x %d x %d), got %d and %d", want, tokens, numQHeads, headDim, len(q), len(out))
	}
	if err := checkSinks(opt.Sinks, numQHeads); err != nil {
		return err
	}
	// fd_reference_params holds pointers: stage it and the buffers in C memory.
	var a cArena
	defer a.free()
	es := elemSize[T]()
	p := (*C.fd_reference_params)(a.alloc(int(unsafe.Sizeof(C.fd_reference_params{}))))
	C.fd_reference_params_init(p)
	p.dtype, p.batch, p.num_q_heads, p.num_kv_heads = C.int32_t(dtype), C.uint32_t(batch), C.uint32_t(numQHeads), C.uint32_t(numKVHeads)
	p.head_dim, p.max_seq_len = C.uint32_t(headDim), C.uint32_t(len(k)/perRow)
	p.q = a.copyIn(dataPtr(q), want*es)
	p.k, p.v = a.copyIn(dataPtr(k), len(k)*es), a.copyIn(dataPtr(v), len(v)*es)
	p.seq_lens = (*C.int32_t)(a.copyIn(unsafe.Pointer(&lens[0]), batch*4))
	if opt.QIndptr != nil {
		p.q_indptr = (*C.int32_t)(a.copyIn(unsafe.Pointer(&opt.QIndptr[0]), len(opt.QIndptr)*4))
	}
	if len(opt.Sinks) > 0 {
		p.sinks = (*C.float)(a.copyIn(unsafe.Pointer(&opt.Sinks[0]), len(opt.Sinks)*4))
	}
	outC := a.alloc(want * es)
	p.out = outC
	p.sm_scale, p.logit_softcap, p.sliding_window = C.float(opt.SmScale), C.float(opt.LogitSoftcap), C.int32_t(opt.SlidingWindow)
	if err := call(func() C.fd_status { return C.fd_reference_attention(p) }); err != nil {
		return err
	}
	if want > 0 {
		C.memcpy(dataPtr(out), outC, C.size_t(want*es))
	}
	return nil
}
