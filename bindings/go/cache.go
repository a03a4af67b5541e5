package flashdec

/*
#include <stdlib.h>
#include <string.h>
#include "flashdec.h"
*/
import "C"

import (
	"reflect"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

// CacheConfig mirrors fd_cache_config. DefaultCacheConfig gives the library defaults.
//
// KStorage and VStorage (both or neither) make the cache manage blocks inside
// memory the caller owns instead of allocating its own. They must be C heap or
// device memory, never Go memory (the cache keeps the pointers, which cgo
// forbids for Go pointers), hold every element the strides address for
// NumLayers layers and MaxBlocks blocks, and outlive the cache. The strides
// (elements) follow fd_cache_config: block/head/token/dim all 0 (packed) or
// all > 0 with the layout's contiguous axis at 1; StrideLayer 0 means
// MaxBlocks * block stride. All must be 0 without external storage.
//
// FP8 storage (DType FP8E4M3 or FP8E5M2, docs/semantics.md S1.1): InputDType
// is the type of the K, V and Q given to layer writes and of the engine's
// step tensors (F16 or BF16, or F32 on the CPU); DTypeDefault (-1, what
// DefaultCacheConfig gives) means DType, the only value besides DType itself
// a cache that is not FP8 takes. KScales and VScales are the per-layer
// dequantisation scales (NumLayers each, finite and > 0; nil: all 1), copied
// at creation (NewCache stages them in C memory); Cache.Config reports them
// nil, as fd_cache_get_config does: read them with Cache.KVScales.
type CacheConfig struct {
	NumLayers, NumKVHeads, HeadDim, BlockSize, MaxBlocks uint32
	PrefixCacheCapacityBlocks                            uint32
	DType                                                DType
	Layout                                               Layout
	DeviceType, DeviceOrdinal                            int32
	KStorage, VStorage                                   unsafe.Pointer
	StrideLayer, StrideBlock, StrideHead                 int64
	StrideToken, StrideDim                               int64
	InputDType                                           DType
	KScales, VScales                                     []float32
	// RopeStyle is the RoPE convention of the cache's fused writes
	// (WriteLayerRope, and so the engine's steps and prefill); the zero
	// value is RopeSplitHalf.
	RopeStyle RopeStyle
}

// ResolvedInputDType is the type layer writes and engine steps take:
// InputDType, or DType for DTypeDefault.
func (cfg CacheConfig) ResolvedInputDType() DType {
	if cfg.InputDType < 0 {
		return cfg.DType
	}
	return cfg.InputDType
}

// DefaultCacheConfig returns fd_cache_config_init's defaults (InputDType
// DTypeDefault).
func DefaultCacheConfig() CacheConfig {
	var c C.fd_cache_config
	C.fd_cache_config_init(&c)
	return configFromC(&c)
}

func configFromC(c *C.fd_cache_config) CacheConfig {
	return CacheConfig{
		NumLayers: uint32(c.num_layers), NumKVHeads: uint32(c.num_kv_heads), HeadDim: uint32(c.head_dim),
		BlockSize: uint32(c.block_size), MaxBlocks: uint32(c.max_blocks),
		PrefixCacheCapacityBlocks: uint32(c.prefix_cache_capacity_blocks),
		DType:                     DType(c.dtype), Layout: Layout(c.layout),
		DeviceType: int32(c.device._type), DeviceOrdinal: int32(c.device.ordinal),
		KStorage: c.k_storage, VStorage: c.v_storage,
		StrideLayer: int64(c.stride_layer), StrideBlock: int64(c.stride_block), StrideHead: int64(c.stride_head),
		StrideToken: int64(c.stride_token), StrideDim: int64(c.stride_dim),
		InputDType: DType(c.input_dtype), RopeStyle: RopeStyle(c.rope_style),
	}
}

func (cfg CacheConfig) toC() C.fd_cache_config {
	var c C.fd_cache_config
	C.fd_cache_config_init(&c)
	c.num_layers, c.num_kv_heads, c.head_dim = C.uint32_t(cfg.NumLayers), C.uint32_t(cfg.NumKVHeads), C.uint32_t(cfg.HeadDim)
	c.block_size, c.max_blocks = C.uint32_t(cfg.BlockSize), C.uint32_t(cfg.MaxBlocks)
	c.prefix_cache_capacity_blocks = C.uint32_t(cfg.PrefixCacheCapacityBlocks)
	c.dtype, c.layout = C.int32_t(cfg.DType), C.int32_t(cfg.Layout)
	c.device._type, c.device.ordinal = C.int32_t(cfg.DeviceType), C.int32_t(cfg.DeviceOrdinal)
	c.k_storage, c.v_storage = cfg.KStorage, cfg.VStorage
	c.stride_layer, c.stride_block, c.stride_head = C.int64_t(cfg.StrideLayer), C.int64_t(cfg.StrideBlock), C.int64_t(cfg.StrideHead)
	c.stride_token, c.stride_dim = C.int64_t(cfg.StrideToken), C.int64_t(cfg.StrideDim)
	c.input_dtype, c.rope_style = C.int32_t(cfg.InputDType), C.int32_t(cfg.RopeStyle)
	return c
}

// Cache is a paged KV cache (fd_cache). Externally synchronised: use it from
// one goroutine at a time. Close it when done.
//
// Engines built on the cache borrow it: its calls and theirs are serialised
// by mu (so an engine finalizer cannot race a cache call), and Close destroys
// them before the cache.
type Cache struct {
	mu      sync.Mutex
	h       *C.fd_cache
	cfg     CacheConfig
	engines []*engineHandle // not *Engine: no cycle, so Engine finalizers run
}

// NewCache creates a cache with zero-initialised storage.
func NewCache(cfg CacheConfig) (*Cache, error) {
	c := cfg.toC()
	// fd_cache_config must not hold Go pointers: the scales go to C memory.
	var a cArena
	defer a.free()
	for _, s := range []struct {
		x    []float32
		dst  **C.float
		name string
	}{{cfg.KScales, &c.k_scales, "k_scales"}, {cfg.VScales, &c.v_scales, "v_scales"}} {
		if s.x == nil {
			continue
		}
		if err := checkScales(s.x, cfg.NumLayers, s.name); err != nil {
			return nil, err
		}
		if len(s.x) > 0 {
			*s.dst = (*C.float)(a.copyIn(unsafe.Pointer(&s.x[0]), len(s.x)*4))
		}
	}
	var h *C.fd_cache
	if err := call(func() C.fd_status { return C.fd_cache_create(&c, &h) }); err != nil {
		return nil, err
	}
	cache := &Cache{h: h}
	runtime.SetFinalizer(cache, (*Cache).Close)
	var got C.fd_cache_config
	got.struct_size = C.uint32_t(unsafe.Sizeof(got))
	if err := call(func() C.fd_status { return C.fd_cache_get_config(h, &got) }); err != nil {
		cache.Close()
		return nil, err
	}
	cache.cfg = configFromC(&got)
	return cache, nil
}

// Close destroys the engines built on the cache, then the cache; idempotent.
func (c *Cache) Close() {
	c.mu.Lock()
	for _, e := range c.engines {
		e.destroy()
	}
	c.engines = nil
	if c.h != nil {
		C.fd_cache_destroy(c.h)
		c.h = nil
	}
	c.mu.Unlock()
	runtime.SetFinalizer(c, nil)
}

func (c *Cache) handle() (*C.fd_cache, error) {
	if c.h == nil {
		return nil, &Error{Status: InvalidState, Message: "cache is closed"}
	}
	return c.h, nil
}

// do runs one C call on the cache's handle and keeps the cache alive past it.
func (c *Cache) do(f func(h *C.fd_cache) C.fd_status) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, err := c.handle()
	if err != nil {
		return err
	}
	err = call(func() C.fd_status { return f(h) })
	runtime.KeepAlive(c)
	return err
}

// Config returns the configuration with defaults resolved.
func (c *Cache) Config() CacheConfig { return c.cfg }

func (c *Cache) AddRequest(id uint64) error {
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_add_request(h, C.uint64_t(id)) })
}
func (c *Cache) FinishRequest(id uint64) error {
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_finish_request(h, C.uint64_t(id)) })
}
func (c *Cache) CancelRequest(id uint64) error {
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_cancel_request(h, C.uint64_t(id)) })
}

// RequestState is an fd_request_state (0 unknown, 1 active, 2 finished, 3 cancelled).
type RequestState int32

const (
	RequestUnknown   RequestState = C.FD_REQUEST_UNKNOWN
	RequestActive    RequestState = C.FD_REQUEST_ACTIVE
	RequestFinished  RequestState = C.FD_REQUEST_FINISHED
	RequestCancelled RequestState = C.FD_REQUEST_CANCELLED
)

func (c *Cache) RequestState(id uint64) (RequestState, error) {
	var s C.int32_t
	err := c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_request_state(h, C.uint64_t(id), &s) })
	return RequestState(s), err
}

func idsPtr(ids []uint64) *C.uint64_t {
	if len(ids) == 0 {
		return nil
	}
	return (*C.uint64_t)(unsafe.Pointer(&ids[0]))
}

func i32Ptr(x []int32) *C.int32_t {
	if len(x) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&x[0]))
}

// checkRowCounts refuses a per-row array (token_counts) of n entries for rows rows.
func checkRowCounts(n, rows int, what string) error {
	if n != rows {
		return invalid("%s: expected %d entries (one per row), got %d", what, rows, n)
	}
	return nil
}

func u32Ptr(x []uint32) *C.uint32_t {
	if len(x) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&x[0]))
}

func dataPtr[T Elem](x []T) unsafe.Pointer {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Pointer(&x[0])
}

// BlocksNeeded returns the blocks growing every id by one token needs, and the free blocks.
func (c *Cache) BlocksNeeded(ids []uint64) (needed, free uint32, err error) {
	var n, f C.uint32_t
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_blocks_needed(h, idsPtr(ids), C.uint32_t(len(ids)), &n, &f)
	})
	runtime.KeepAlive(ids)
	return uint32(n), uint32(f), err
}

// BlocksNeededMulti returns the blocks growing ids[i] by tokenCounts[i] >= 1
// tokens needs (what BeginMulti with the same lists allocates), and the free blocks.
func (c *Cache) BlocksNeededMulti(ids []uint64, tokenCounts []uint32) (needed, free uint32, err error) {
	if err := checkRowCounts(len(tokenCounts), len(ids), "token_counts"); err != nil {
		return 0, 0, err
	}
	var n, f C.uint32_t
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_blocks_needed_multi(h, idsPtr(ids), u32Ptr(tokenCounts), C.uint32_t(len(ids)), &n, &f)
	})
	runtime.KeepAlive(ids)
	runtime.KeepAlive(tokenCounts)
	return uint32(n), uint32(f), err
}

func (c *Cache) MaxBlocksPerSeq(ids []uint64) (uint32, error) {
	var n C.uint32_t
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_max_blocks_per_seq(h, idsPtr(ids), C.uint32_t(len(ids)), &n)
	})
	runtime.KeepAlive(ids)
	return uint32(n), err
}

// Export returns committed block tables ([len(ids)][stride], -1 padded) and seq_lens.
// stride 0 means the smallest valid stride (at least 1).
func (c *Cache) Export(ids []uint64, stride uint32) (tables []int32, lens []int32, usedStride uint32, err error) {
	if stride == 0 {
		if stride, err = c.MaxBlocksPerSeq(ids); err != nil {
			return nil, nil, 0, err
		}
		if stride == 0 {
			stride = 1
		}
	}
	tables = make([]int32, len(ids)*int(stride))
	lens = make([]int32, len(ids))
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_export(h, idsPtr(ids), C.uint32_t(len(ids)), C.uint32_t(stride), i32Ptr(tables), i32Ptr(lens))
	})
	runtime.KeepAlive(ids)
	if err != nil {
		return nil, nil, 0, err
	}
	return tables, lens, stride, nil
}

func (c *Cache) StateVersion() (uint64, error) {
	var v C.uint64_t
	err := c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_state_version(h, &v) })
	return uint64(v), err
}

func (c *Cache) checkTokens(elemBytes int, n int, rows int, what string) error {
	if c.cfg.DeviceType != 0 {
		return invalid("%s: Go slices need a CPU cache", what)
	}
	if want := rows * int(c.cfg.NumKVHeads) * int(c.cfg.HeadDim); n != want {
		return invalid("%s: expected %d elements (%d x %d x %d), got %d", what, want, rows, c.cfg.NumKVHeads, c.cfg.HeadDim, n)
	}
	return nil
}

// checkScales refuses a per-layer scale array whose length is not the
// cache's layer count (C reads numLayers entries); the values are the
// library's to check, naming the entry.
func checkScales(x []float32, numLayers uint32, what string) error {
	if len(x) != int(numLayers) {
		return invalid("%s: expected %d entries (one per layer), got %d", what, numLayers, len(x))
	}
	return nil
}

// SetKVScales replaces an FP8 cache's per-layer K and V dequantisation
// scales (fd_cache_set_kv_scales; NumLayers each, finite and > 0): later
// writes quantise with them, stored tokens are read with them (their bytes
// do not change). InvalidState for a cache that is not FP8 or while a
// transaction is open; InvalidArgument naming a bad entry. Nothing changes
// on error.
func (c *Cache) SetKVScales(kScales, vScales []float32) error {
	if err := checkScales(kScales, c.cfg.NumLayers, "k_scales"); err != nil {
		return err
	}
	if err := checkScales(vScales, c.cfg.NumLayers, "v_scales"); err != nil {
		return err
	}
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_set_kv_scales(h, f32Ptr(kScales), f32Ptr(vScales))
	})
	runtime.KeepAlive(kScales)
	runtime.KeepAlive(vScales)
	return err
}

// KVScales returns the per-layer K and V dequantisation scales
// (fd_cache_get_kv_scales); all 1 for a cache that is not FP8.
func (c *Cache) KVScales() (kScales, vScales []float32, err error) {
	kScales, vScales = make([]float32, c.cfg.NumLayers), make([]float32, c.cfg.NumLayers)
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_get_kv_scales(h, f32Ptr(kScales), f32Ptr(vScales))
	})
	if err != nil {
		return nil, nil, err
	}
	return kScales, vScales, nil
}

func f32Ptr(x []float32) *C.float {
	if len(x) == 0 {
		return nil
	}
	return (*C.float)(unsafe.Pointer(&x[0]))
}

// Append is the legacy single-layer append (num_layers == 1); k and v in the
// cache's input type (ResolvedInputDType).
func Append[T Elem](c *Cache, ids []uint64, k, v []T) error {
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(k), len(ids), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(v), len(ids), "v"); err != nil {
		return err
	}
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_append(h, idsPtr(ids), C.uint32_t(len(ids)), dataPtr(k), dataPtr(v), nil)
	})
	runtime.KeepAlive(ids)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// Metric is one field of a metrics struct, in header order.
type Metric struct {
	Name    string
	Uint    uint64
	Float   float64
	IsFloat bool
}

// structFields lists the counter/gauge fields of a cgo struct by their C names.
func structFields(v interface{}) []Metric {
	rv := reflect.ValueOf(v)
	rt := rv.Type()
	var out []Metric
	for i := 0; i < rt.NumField(); i++ {
		name := strings.TrimPrefix(rt.Field(i).Name, "_")
		if name == "struct_size" || isPadding(name) || name == "" {
			continue
		}
		f := rv.Field(i)
		switch f.Kind() {
		case reflect.Float32, reflect.Float64:
			out = append(out, Metric{Name: name, Float: f.Float(), IsFloat: true})
		case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			out = append(out, Metric{Name: name, Uint: f.Uint()})
		case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			out = append(out, Metric{Name: name, Uint: uint64(f.Int())})
		}
	}
	return out
}

// isPadding reports the reservedN padding fields (not reserved_tokens etc.).
func isPadding(name string) bool {
	rest := strings.TrimPrefix(name, "reserved")
	return rest != name && rest != "" && strings.Trim(rest, "0123456789") == ""
}

// Metrics is a snapshot of fd_cache_metrics: every field, in header order.
type Metrics []Metric

// Get returns a field by its C name (0, false when unknown).
func (m Metrics) Get(name string) (Metric, bool) {
	for _, x := range m {
		if x.Name == name {
			return x, true
		}
	}
	return Metric{}, false
}

// U returns an integer field by name (0 when unknown).
func (m Metrics) U(name string) uint64 { x, _ := m.Get(name); return x.Uint }

func (c *Cache) Metrics() (Metrics, error) {
	var m C.fd_cache_metrics
	m.struct_size = C.uint32_t(unsafe.Sizeof(m))
	if err := c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_metrics_get(h, &m) }); err != nil {
		return nil, err
	}
	return Metrics(structFields(m)), nil
}

// Validate checks every invariant; an *Error with Status Invariant names the first violation.
func (c *Cache) Validate() error {
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_validate(h) })
}

// ExportAsync is Export into caller buffers (fd_cache_export_async): for a
// CUDA cache, device pointers written on stream (a cudaStream_t, nil for the
// default stream) without host synchronisation; for a CPU cache, host memory
// written before return (Go memory is fine there, e.g. &tables[0]). tables
// holds len(ids)*stride int32 and lens len(ids) int32; either may be nil. On
// error nothing is written or enqueued. The caller keeps the buffers valid
// until the stream reaches the copy.
func (c *Cache) ExportAsync(ids []uint64, stride uint32, tables, lens, stream unsafe.Pointer) error {
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_export_async(h, idsPtr(ids), C.uint32_t(len(ids)), C.uint32_t(stride),
			(*C.int32_t)(tables), (*C.int32_t)(lens), C.fd_stream(stream))
	})
	runtime.KeepAlive(ids)
	return err
}

// AsyncError reports the first asynchronous device fault of work the cache
// enqueued (fd_cache_async_error): an *Error with Status DeviceError naming
// the CUDA error, or nil. It never blocks; a CPU cache always returns nil.
func (c *Cache) AsyncError() error {
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_cache_async_error(h) })
}

func prefixCString(id string) (*C.char, error) {
	if strings.IndexByte(id, 0) >= 0 {
		return nil, invalid("prefix_id must not contain NUL characters")
	}
	return C.CString(id), nil
}

// RegisterPrefix registers a shared prefix: kBlocks/vBlocks hold
// [num_layers, n, num_kv_heads, block_size, head_dim] elements (n inferred)
// of the cache's storage DType (uint8 bits for an FP8 cache).
func RegisterPrefix[T Elem](c *Cache, id string, kBlocks, vBlocks []T) error {
	if err := checkElem[T](c.cfg.DType, "k_blocks"); err != nil {
		return err
	}
	n, err := c.prefixBlockCount(len(kBlocks), len(vBlocks))
	if err != nil {
		return err
	}
	cid, err := prefixCString(id)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cid))
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_prefix_register(h, cid, dataPtr(kBlocks), dataPtr(vBlocks), C.uint32_t(n), nil)
	})
	runtime.KeepAlive(kBlocks)
	runtime.KeepAlive(vBlocks)
	return err
}

// prefixBlockCount infers n from prefix data of kLen/vLen elements
// ([num_layers, n, num_kv_heads, block_size, head_dim] each).
func (c *Cache) prefixBlockCount(kLen, vLen int) (int, error) {
	per := int(c.cfg.NumLayers * c.cfg.NumKVHeads * c.cfg.BlockSize * c.cfg.HeadDim)
	if per == 0 || kLen == 0 || kLen%per != 0 || vLen != kLen {
		return 0, invalid("k_blocks/v_blocks: need equal positive multiples of %d elements, got %d and %d", per, kLen, vLen)
	}
	return kLen / per, nil
}

func (c *Cache) AttachPrefix(requestID uint64, prefixID string) error {
	cid, err := prefixCString(prefixID)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cid))
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_prefix_attach(h, C.uint64_t(requestID), cid) })
}

func (c *Cache) EvictPrefix(prefixID string) error {
	cid, err := prefixCString(prefixID)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cid))
	return c.do(func(h *C.fd_cache) C.fd_status { return C.fd_prefix_evict(h, cid) })
}

// PrefixInfo mirrors fd_prefix_info.
type PrefixInfo struct {
	NumBlocks, RefCount uint32
	LastUse             uint64
	FirstBlock          int32
}

func (c *Cache) PrefixInfo(prefixID string) (PrefixInfo, error) {
	cid, err := prefixCString(prefixID)
	if err != nil {
		return PrefixInfo{}, err
	}
	defer C.free(unsafe.Pointer(cid))
	var i C.fd_prefix_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	if err := c.do(func(h *C.fd_cache) C.fd_status { return C.fd_prefix_get_info(h, cid, &i) }); err != nil {
		return PrefixInfo{}, err
	}
	return PrefixInfo{uint32(i.num_blocks), uint32(i.ref_count), uint64(i.last_use), int32(i.first_block)}, nil
}

// Tx is a transaction: a value handle (id + cache version). Misuse after
// Commit/Abort is reported by the library, never undefined.
type Tx struct {
	cache *Cache
	raw   C.fd_tx
}

// Begin opens a transaction for one token of each listed request.
func (c *Cache) Begin(ids []uint64) (*Tx, error) {
	var tx C.fd_tx
	err := c.do(func(h *C.fd_cache) C.fd_status { return C.fd_tx_begin(h, idsPtr(ids), C.uint32_t(len(ids)), &tx) })
	runtime.KeepAlive(ids)
	if err != nil {
		return nil, err
	}
	return &Tx{cache: c, raw: tx}, nil
}

// BeginMulti opens a transaction of tokenCounts[i] >= 1 new tokens for
// request ids[i] (fd_tx_begin_multi): a prompt chunk or speculative draft
// tokens. The layer writes then take TxInfo.TokenCount tokens packed in row
// order. As Begin otherwise.
func (c *Cache) BeginMulti(ids []uint64, tokenCounts []uint32) (*Tx, error) {
	if err := checkRowCounts(len(tokenCounts), len(ids), "token_counts"); err != nil {
		return nil, err
	}
	var tx C.fd_tx
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_begin_multi(h, idsPtr(ids), u32Ptr(tokenCounts), C.uint32_t(len(ids)), &tx)
	})
	runtime.KeepAlive(ids)
	runtime.KeepAlive(tokenCounts)
	if err != nil {
		return nil, err
	}
	return &Tx{cache: c, raw: tx}, nil
}

// Truncate shortens committed requests to seqLens (fd_cache_truncate): each
// at most the request's seq_len and not into an attached prefix; blocks past
// the new lengths return to the free list. All or nothing.
func (c *Cache) Truncate(ids []uint64, seqLens []int32) error {
	if len(seqLens) != len(ids) {
		return invalid("seq_lens: expected %d entries (one per request), got %d", len(ids), len(seqLens))
	}
	err := c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_cache_truncate(h, idsPtr(ids), i32Ptr(seqLens), C.uint32_t(len(ids)))
	})
	runtime.KeepAlive(ids)
	runtime.KeepAlive(seqLens)
	return err
}

// ID is the transaction id (ids start at 1 in each cache).
func (t *Tx) ID() uint64 { return uint64(t.raw.id) }

// TxInfo mirrors fd_tx_info. TokenCount is the new tokens, the sum of the
// rows' token counts (= Batch for Begin): the first dimension of the layer
// writes' K, V and Q.
type TxInfo struct {
	Batch, NextLayer           uint32
	State                      int32
	MaxBlocksPerSeq, NewBlocks uint32
	TokenCount                 uint32
}

func (t *Tx) Info() (TxInfo, error) {
	var i C.fd_tx_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	err := t.cache.do(func(h *C.fd_cache) C.fd_status { return C.fd_tx_get_info(h, t.raw, &i) })
	return TxInfo{uint32(i.batch), uint32(i.next_layer), int32(i.state), uint32(i.max_blocks_per_seq), uint32(i.new_block_count),
		uint32(i.token_count)}, err
}

// TxRows is the per-row view of an open transaction.
type TxRows struct {
	RequestIDs                                     []uint64
	Positions, BlockIDs, Offsets, EffectiveSeqLens []int32
}

func (t *Tx) Rows() (TxRows, error) {
	info, err := t.Info()
	if err != nil {
		return TxRows{}, err
	}
	n := int(info.Batch)
	r := TxRows{make([]uint64, n), make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)}
	err = t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_get_rows(h, t.raw, C.uint32_t(n), idsPtr(r.RequestIDs), i32Ptr(r.Positions),
			i32Ptr(r.BlockIDs), i32Ptr(r.Offsets), i32Ptr(r.EffectiveSeqLens))
	})
	return r, err
}

// TxTokens is the per-token view of an open transaction, in packed order
// (row 0's new tokens by position, then row 1's, ...): the layer writes' order.
type TxTokens struct {
	Positions, BlockIDs, Offsets []int32
}

// Tokens returns every new token's position, block and offset (fd_tx_get_tokens).
func (t *Tx) Tokens() (TxTokens, error) {
	info, err := t.Info()
	if err != nil {
		return TxTokens{}, err
	}
	n := int(info.TokenCount)
	r := TxTokens{make([]int32, n), make([]int32, n), make([]int32, n)}
	err = t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_get_tokens(h, t.raw, C.uint32_t(n), i32Ptr(r.Positions), i32Ptr(r.BlockIDs), i32Ptr(r.Offsets))
	})
	return r, err
}

// BlockTables returns the rows' tables including new blocks (stride 0: smallest valid).
func (t *Tx) BlockTables(stride uint32) ([]int32, uint32, error) {
	info, err := t.Info()
	if err != nil {
		return nil, 0, err
	}
	if stride == 0 {
		stride = info.MaxBlocksPerSeq
		if stride == 0 {
			stride = 1
		}
	}
	out := make([]int32, int(info.Batch)*int(stride))
	err = t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_block_tables(h, t.raw, C.uint32_t(stride), i32Ptr(out))
	})
	return out, stride, err
}

// BlockTablesAsync is BlockTables plus the rows' effective seq_lens into
// caller buffers (fd_tx_block_tables_async), with ExportAsync's rules:
// tables holds batch*stride int32, lens batch int32, either may be nil.
func (t *Tx) BlockTablesAsync(stride uint32, tables, lens, stream unsafe.Pointer) error {
	return t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_block_tables_async(h, t.raw, C.uint32_t(stride), (*C.int32_t)(tables), (*C.int32_t)(lens), C.fd_stream(stream))
	})
}

// TokenIndptrAsync writes the rows' query-token offsets (fd_tx_token_indptr_async):
// batch+1 int32, entry i = the new tokens of rows 0..i-1, ready as
// DecodeOptions.QIndptr over the transaction's tokens; with ExportAsync's
// rules (a CPU cache writes host memory before return, e.g. &indptr[0]).
// nil is the library's InvalidArgument.
func (t *Tx) TokenIndptrAsync(indptr, stream unsafe.Pointer) error {
	return t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_token_indptr_async(h, t.raw, (*C.int32_t)(indptr), C.fd_stream(stream))
	})
}

// WriteLayer writes one layer's K and V ([token_count, num_kv_heads, head_dim]
// each: the new tokens packed in row order; token_count = batch for Begin),
// of the cache's input type (an FP8 cache quantises them with the layer's
// scales).
func WriteLayer[T Elem](t *Tx, layer uint32, k, v []T) error {
	c := t.cache
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "k"); err != nil {
		return err
	}
	info, err := t.Info()
	if err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(k), int(info.TokenCount), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(v), int(info.TokenCount), "v"); err != nil {
		return err
	}
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_write_layer(h, t.raw, C.uint32_t(layer), dataPtr(k), dataPtr(v), nil)
	})
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// WriteLayerRope rotates q and k at each token's position in the cache's
// CacheConfig.RopeStyle, writes rotated K and raw V, and writes the rotated Q
// to qOut (same length as q, [token_count, numQHeads, head_dim]).
func WriteLayerRope[T Elem](t *Tx, layer uint32, q []T, numQHeads uint32, k, v []T, rotaryDim uint32, ropeBase float32, qOut []T) error {
	c := t.cache
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "q"); err != nil {
		return err
	}
	info, err := t.Info()
	if err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(k), int(info.TokenCount), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(v), int(info.TokenCount), "v"); err != nil {
		return err
	}
	want := int(info.TokenCount) * int(numQHeads) * int(c.cfg.HeadDim)
	if len(q) != want || len(qOut) != want {
		return invalid("q/q_out: expected %d elements, got %d and %d", want, len(q), len(qOut))
	}
	err = c.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_write_layer_rope(h, t.raw, C.uint32_t(layer), dataPtr(q), C.uint32_t(numQHeads), dataPtr(k), dataPtr(v),
			C.uint32_t(rotaryDim), C.float(ropeBase), dataPtr(qOut), nil)
	})
	runtime.KeepAlive(q)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	runtime.KeepAlive(qOut)
	return err
}

func (t *Tx) Commit() error {
	return t.cache.do(func(h *C.fd_cache) C.fd_status { return C.fd_tx_commit(h, t.raw) })
}

// CommitKeep publishes the first keepCounts[i] new tokens of row i and drops
// the rest (fd_tx_commit_keep: speculative verify); blocks holding only
// dropped tokens return to the free list. On error the transaction stays open.
func (t *Tx) CommitKeep(keepCounts []uint32) error {
	err := t.cache.do(func(h *C.fd_cache) C.fd_status {
		return C.fd_tx_commit_keep(h, t.raw, u32Ptr(keepCounts), C.uint32_t(len(keepCounts)))
	})
	runtime.KeepAlive(keepCounts)
	return err
}

func (t *Tx) Abort() error {
	return t.cache.do(func(h *C.fd_cache) C.fd_status { return C.fd_tx_abort(h, t.raw) })
}
