package flashdec

/*
#include <stdlib.h>
#include "flashdec.h"
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// The decode engine (docs/semantics.md S8) over a CPU cache. An Engine borrows its
// Cache: both are externally synchronised, their calls are serialised by the
// cache's lock, and closing the cache closes the engine first.

// EngineConfig mirrors fd_engine_config. DefaultEngineConfig gives the library
// defaults; 0 in NumQHeads, RotaryDim, SmScale and CPUThreads means "default".
type EngineConfig struct {
	NumQHeads, RotaryDim uint32
	RopeBase, SmScale    float32
	CPUThreads           uint32
}

// DefaultEngineConfig returns fd_engine_config_init's defaults.
func DefaultEngineConfig() EngineConfig {
	var c C.fd_engine_config
	C.fd_engine_config_init(&c)
	return EngineConfig{NumQHeads: uint32(c.num_q_heads), RotaryDim: uint32(c.rotary_dim),
		RopeBase: float32(c.rope_base), SmScale: float32(c.sm_scale), CPUThreads: uint32(c.cpu_threads)}
}

// engineHandle is the C handle, shared by the Engine and its Cache (which
// destroys it first when it closes). Guarded by the cache's mu.
type engineHandle struct{ h *C.fd_engine }

func (e *engineHandle) destroy() {
	if e.h != nil {
		C.fd_engine_destroy(e.h)
		e.h = nil
	}
}

// Engine is a decode engine (fd_engine) on a Cache. Close it when done.
type Engine struct {
	cache     *Cache
	eh        *engineHandle
	numQHeads uint32 // resolved: the config's, or the cache's num_kv_heads
}

// NewEngine creates an engine on cache (a CPU cache; it may already hold
// requests, usable in unscheduled mode only).
func NewEngine(cache *Cache, cfg EngineConfig) (*Engine, error) {
	var c C.fd_engine_config
	C.fd_engine_config_init(&c)
	c.num_q_heads, c.rotary_dim = C.uint32_t(cfg.NumQHeads), C.uint32_t(cfg.RotaryDim)
	c.rope_base, c.sm_scale, c.cpu_threads = C.float(cfg.RopeBase), C.float(cfg.SmScale), C.uint32_t(cfg.CPUThreads)
	if cache == nil {
		return nil, invalid("cache must not be nil")
	}
	cache.mu.Lock()
	defer cache.mu.Unlock()
	ch, err := cache.handle()
	if err != nil {
		return nil, err
	}
	var h *C.fd_engine
	if err := call(func() C.fd_status { return C.fd_engine_create(ch, &c, &h) }); err != nil {
		return nil, err
	}
	e := &Engine{cache: cache, eh: &engineHandle{h: h}, numQHeads: cfg.NumQHeads}
	if e.numQHeads == 0 {
		e.numQHeads = cache.cfg.NumKVHeads
	}
	cache.engines = append(cache.engines, e.eh)
	runtime.SetFinalizer(e, (*Engine).Close)
	return e, nil
}

// Close destroys the engine (an open step is aborted); idempotent. The cache
// and its requests stay as they are.
func (e *Engine) Close() {
	c := e.cache
	c.mu.Lock()
	e.eh.destroy()
	for i, x := range c.engines {
		if x == e.eh {
			c.engines = append(c.engines[:i], c.engines[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	runtime.SetFinalizer(e, nil)
}

// Cache is the cache the engine drives.
func (e *Engine) Cache() *Cache { return e.cache }

// NumQHeads is the engine's resolved number of query heads.
func (e *Engine) NumQHeads() uint32 { return e.numQHeads }

// do runs one C call on the engine's handle under the cache's lock.
func (e *Engine) do(f func(h *C.fd_engine) C.fd_status) error {
	c := e.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.eh.h == nil {
		return closedError("engine")
	}
	err := call(func() C.fd_status { return f(e.eh.h) })
	runtime.KeepAlive(e)
	return err
}

// AddRequest adds a waiting request (unscheduled mode).
func (e *Engine) AddRequest(id uint64) error {
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_add_request(h, C.uint64_t(id)) })
}

// Admit makes a waiting request active in the cache (unscheduled mode).
func (e *Engine) Admit(id uint64) error {
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_admit(h, C.uint64_t(id)) })
}

// Finish finishes a waiting or active request (both modes).
func (e *Engine) Finish(id uint64) error {
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_finish(h, C.uint64_t(id)) })
}

// Cancel is Finish with the terminal state cancelled.
func (e *Engine) Cancel(id uint64) error {
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_cancel(h, C.uint64_t(id)) })
}

// EngineRequestState is an fd_engine_request_state.
type EngineRequestState int32

const (
	EngineRequestUnknown   EngineRequestState = C.FD_ENGINE_REQUEST_UNKNOWN
	EngineRequestWaiting   EngineRequestState = C.FD_ENGINE_REQUEST_WAITING
	EngineRequestActive    EngineRequestState = C.FD_ENGINE_REQUEST_ACTIVE
	EngineRequestFinished  EngineRequestState = C.FD_ENGINE_REQUEST_FINISHED
	EngineRequestCancelled EngineRequestState = C.FD_ENGINE_REQUEST_CANCELLED
	EngineRequestRejected  EngineRequestState = C.FD_ENGINE_REQUEST_REJECTED
)

// RequestState reports a request's state (unknown ids: EngineRequestUnknown).
func (e *Engine) RequestState(id uint64) (EngineRequestState, error) {
	var s C.int32_t
	err := e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_get_request_state(h, C.uint64_t(id), &s) })
	return EngineRequestState(s), err
}

// StepOutcome is an fd_engine_step_outcome.
type StepOutcome int32

const (
	StepOpened       StepOutcome = C.FD_STEP_OPENED
	StepBackpressure StepOutcome = C.FD_STEP_BACKPRESSURE
)

// Step is the result of BeginStep or BeginStepMulti. When Outcome is
// StepBackpressure nothing changed (but backpressure_count) and no layer may
// run; otherwise run StepLayer for every layer in order, then Commit,
// CommitKeep or Abort. Tokens is the step's new tokens: Batch, or the sum of
// BeginStepMulti's token counts.
type Step struct {
	engine                          *Engine
	tx                              C.fd_tx
	Outcome                         StepOutcome
	Batch, NeededBlocks, FreeBlocks uint32
	Tokens                          uint32
}

// Opened reports whether a step transaction is open.
func (s *Step) Opened() bool { return s.Outcome == StepOpened }

// TxID is the id of the step's cache transaction (0 on backpressure).
func (s *Step) TxID() uint64 { return uint64(s.tx.id) }

// BeginStep opens a step: one new token for each listed request.
func (e *Engine) BeginStep(ids []uint64) (*Step, error) {
	var st C.fd_engine_step
	st.struct_size = C.uint32_t(unsafe.Sizeof(st))
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_begin_step(h, idsPtr(ids), C.uint32_t(len(ids)), &st)
	})
	runtime.KeepAlive(ids)
	if err != nil {
		return nil, err
	}
	return e.newStep(&st, uint32(len(ids))), nil
}

// BeginStepMulti opens a step of tokenCounts[i] >= 1 tokens for request ids[i]
// (fd_engine_begin_step_multi: speculative verify, a prompt chunk whose
// attention is needed). StepLayer then takes the step's Tokens tokens packed
// in row order, each attending causally.
func (e *Engine) BeginStepMulti(ids []uint64, tokenCounts []uint32) (*Step, error) {
	if err := checkRowCounts(len(tokenCounts), len(ids), "token_counts"); err != nil {
		return nil, err
	}
	var st C.fd_engine_step
	st.struct_size = C.uint32_t(unsafe.Sizeof(st))
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_begin_step_multi(h, idsPtr(ids), u32Ptr(tokenCounts), C.uint32_t(len(ids)), &st)
	})
	runtime.KeepAlive(ids)
	runtime.KeepAlive(tokenCounts)
	if err != nil {
		return nil, err
	}
	var tokens uint64 // the library refused a sum above INT32_MAX
	for _, n := range tokenCounts {
		tokens += uint64(n)
	}
	return e.newStep(&st, uint32(tokens)), nil
}

func (e *Engine) newStep(st *C.fd_engine_step, tokens uint32) *Step {
	return &Step{engine: e, tx: st.tx, Outcome: StepOutcome(st.outcome), Batch: uint32(st.batch),
		NeededBlocks: uint32(st.needed_blocks), FreeBlocks: uint32(st.free_blocks), Tokens: tokens}
}

func (s *Step) checkOpened() error {
	if !s.Opened() {
		return &Error{Status: InvalidState, Message: "step was not opened (backpressure)"}
	}
	return nil
}

// StepLayer runs one layer of an open step: RoPE on q and k at each token's
// position, append, paged decode. q and out are [tokens, num_q_heads,
// head_dim], k and v [tokens, num_kv_heads, head_dim], the step's Tokens
// packed in row order (Tokens = Batch for BeginStep); out is written on
// success only. Any library failure aborts the whole step. All four are of
// the cache's input type (ResolvedInputDType: an FP8 cache's F16/BF16/F32;
// the engine reads the layer scales at BeginStep).
func StepLayer[T Elem](s *Step, layer uint32, q, k, v, out []T) error {
	if err := s.checkOpened(); err != nil {
		return err
	}
	e := s.engine
	c := e.cache
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "q"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(k), int(s.Tokens), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(v), int(s.Tokens), "v"); err != nil {
		return err
	}
	want := int(s.Tokens) * int(e.numQHeads) * int(c.cfg.HeadDim)
	if len(q) != want || len(out) != want {
		return invalid("q/out: expected %d elements (%d x %d x %d), got %d and %d", want, s.Tokens, e.numQHeads, c.cfg.HeadDim, len(q), len(out))
	}
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_step_layer(h, s.tx, C.uint32_t(layer), dataPtr(q), dataPtr(k), dataPtr(v), dataPtr(out), nil)
	})
	runtime.KeepAlive(q)
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	runtime.KeepAlive(out)
	return err
}

// Commit publishes the step: every row's seq_len grows by one.
func (s *Step) Commit() error {
	if err := s.checkOpened(); err != nil {
		return err
	}
	return s.engine.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_commit_step(h, s.tx) })
}

// CommitKeep publishes the first keepCounts[i] new tokens of row i and drops
// the rest (fd_engine_commit_step_keep: the accept step of speculative
// decoding). On error the step stays open.
func (s *Step) CommitKeep(keepCounts []uint32) error {
	if err := s.checkOpened(); err != nil {
		return err
	}
	err := s.engine.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_commit_step_keep(h, s.tx, u32Ptr(keepCounts), C.uint32_t(len(keepCounts)))
	})
	runtime.KeepAlive(keepCounts)
	return err
}

// Abort rolls the step back.
func (s *Step) Abort() error {
	if err := s.checkOpened(); err != nil {
		return err
	}
	return s.engine.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_abort_step(h, s.tx) })
}

// Prefill appends one prompt token to an active request through every layer:
// k and v are [num_layers, num_kv_heads, head_dim] in the cache's input type.
func Prefill[T Elem](e *Engine, id uint64, k, v []T) error {
	c := e.cache
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(k), int(c.cfg.NumLayers), "k"); err != nil {
		return err
	}
	if err := c.checkTokens(elemSize[T](), len(v), int(c.cfg.NumLayers), "v"); err != nil {
		return err
	}
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_prefill_request_layers(h, C.uint64_t(id), dataPtr(k), dataPtr(v))
	})
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// PrefillTokens appends prompt tokens to an active request through every layer
// in one cache transaction (fd_engine_prefill_request_tokens): k and v are
// [num_layers, n, num_kv_heads, head_dim] (n inferred), token j rotated at
// position seq_len + j; all published at once or none.
func PrefillTokens[T Elem](e *Engine, id uint64, k, v []T) error {
	c := e.cache
	if err := checkElem[T](c.cfg.ResolvedInputDType(), "k"); err != nil {
		return err
	}
	per := int(c.cfg.NumLayers) * int(c.cfg.NumKVHeads) * int(c.cfg.HeadDim)
	if per == 0 || len(k) == 0 || len(k)%per != 0 || len(v) != len(k) {
		return invalid("k/v: need equal positive multiples of num_layers * num_kv_heads * head_dim = %d elements, got %d and %d",
			per, len(k), len(v))
	}
	if !fitsU32(len(k) / per) {
		return invalid("k: %d tokens do not fit in uint32", len(k)/per)
	}
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_prefill_request_tokens(h, C.uint64_t(id), C.uint32_t(len(k)/per), dataPtr(k), dataPtr(v))
	})
	runtime.KeepAlive(k)
	runtime.KeepAlive(v)
	return err
}

// Submit queues a request (scheduler-managed mode; the first call switches
// the engine to it).
func (e *Engine) Submit(spec RequestSpec) error {
	return spec.withC(func(c *C.fd_request_spec) error {
		return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_submit_request(h, c) })
	})
}

// EngineRegisterPrefix registers a shared prefix through the engine (only
// before the first submission); data as for RegisterPrefix.
func EngineRegisterPrefix[T Elem](e *Engine, id string, kBlocks, vBlocks []T) error {
	c := e.cache
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
	err = e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_register_prefix(h, cid, dataPtr(kBlocks), dataPtr(vBlocks), C.uint32_t(n), nil)
	})
	runtime.KeepAlive(kBlocks)
	runtime.KeepAlive(vBlocks)
	return err
}

// EvictPrefix evicts a prefix (only when no request is waiting or active).
func (e *Engine) EvictPrefix(id string) error {
	cid, err := prefixCString(id)
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(cid))
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_evict_prefix(h, cid) })
}

// Fairness mirrors fd_request_fairness: caller-kept counters of one request.
type Fairness struct {
	ID                                     uint64
	WaitSteps, SkipCount, ServiceWaitSteps uint32
}

// Snapshot builds the authoritative snapshot of a scheduler-managed engine
// with the caller's fairness counters (requests not listed get zeros).
func (e *Engine) Snapshot(step uint64, fairness []Fairness) (*Snapshot, error) {
	f := make([]C.fd_request_fairness, len(fairness))
	for i, x := range fairness {
		f[i].id, f[i].wait_steps, f[i].skip_count = C.uint64_t(x.ID), C.uint32_t(x.WaitSteps), C.uint32_t(x.SkipCount)
		f[i].service_wait_steps = C.uint32_t(x.ServiceWaitSteps)
	}
	var fp *C.fd_request_fairness
	if len(f) > 0 {
		fp = &f[0]
	}
	var s *C.fd_snapshot
	err := e.do(func(h *C.fd_engine) C.fd_status {
		return C.fd_engine_snapshot(h, C.uint64_t(step), fp, C.uint32_t(len(f)), &s)
	})
	runtime.KeepAlive(f)
	if err != nil {
		return nil, err
	}
	return newSnapshot(s), nil
}

// ApplyDecision rejects and admits the requests d names, after checking that
// d was planned by a scheduler configured like s from the engine's current
// state (a stale or edited decision is refused with StaleHandle).
func (e *Engine) ApplyDecision(s *Scheduler, d *Decision) error {
	sh, err := s.handle()
	if err != nil {
		return err
	}
	dh, err := d.handle()
	if err != nil {
		return err
	}
	err = e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_apply_decision(h, sh, dh) })
	runtime.KeepAlive(s)
	runtime.KeepAlive(d)
	return err
}

// Metrics is a snapshot of fd_engine_metrics: every field, in header order.
func (e *Engine) Metrics() (Metrics, error) {
	var m C.fd_engine_metrics
	m.struct_size = C.uint32_t(unsafe.Sizeof(m))
	if err := e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_metrics_get(h, &m) }); err != nil {
		return nil, err
	}
	return Metrics(structFields(m)), nil
}

// Validate checks that the engine and its cache agree; an *Error with Status
// Invariant names the first violation.
func (e *Engine) Validate() error {
	return e.do(func(h *C.fd_engine) C.fd_status { return C.fd_engine_validate(h) })
}
