package flashdec

import (
	"errors"
	"math"
	"runtime"
	"testing"
)

const engineQHeads = 4

func newEngine(t *testing.T, c *Cache) *Engine {
	t.Helper()
	cfg := DefaultEngineConfig()
	cfg.NumQHeads, cfg.CPUThreads = engineQHeads, 1
	e, err := NewEngine(c, cfg)
	must(t, err)
	return e
}

func newCache(t *testing.T, cfg CacheConfig) *Cache {
	t.Helper()
	c, err := NewCache(cfg)
	must(t, err)
	return c
}

func engineMetrics(t *testing.T, e *Engine) Metrics {
	t.Helper()
	m, err := e.Metrics()
	must(t, err)
	return m
}

func seqLens(t *testing.T, c *Cache, ids []uint64) []int32 {
	t.Helper()
	_, lens, _, err := c.Export(ids, 0)
	must(t, err)
	return lens
}

// runStep runs every layer of an opened step and commits it. It checks each
// layer's attention output against the same decode done by hand: RoPE on q at
// the rows' positions, then DecodeLayer over the step's block tables and
// effective seq_lens (read through the step's cache transaction, since a
// scheduler-managed request may finish, and leave the cache, on commit).
func runStep(t *testing.T, e *Engine, step *Step, ids []uint64, seed *uint64) {
	t.Helper()
	c := e.Cache()
	cfg := c.Config()
	n := int(step.Batch)
	qs := make([][]float32, cfg.NumLayers)
	outs := make([][]float32, cfg.NumLayers)
	for layer := uint32(0); layer < cfg.NumLayers; layer++ {
		qs[layer] = noise(seed, n*engineQHeads*int(cfg.HeadDim))
		outs[layer] = make([]float32, len(qs[layer]))
		kv := n * int(cfg.NumKVHeads*cfg.HeadDim)
		must(t, StepLayer(step, layer, qs[layer], noise(seed, kv), noise(seed, kv), outs[layer]))
	}
	tx := &Tx{cache: c, raw: step.tx}
	rows, err := tx.Rows()
	must(t, err)
	eq(t, "step rows", rows.RequestIDs, ids)
	tables, _, err := tx.BlockTables(0)
	must(t, err)
	for layer := uint32(0); layer < cfg.NumLayers; layer++ {
		q := append([]float32(nil), qs[layer]...)
		must(t, RopeApply(F32, q, engineQHeads, cfg.HeadDim, rows.Positions, cfg.HeadDim, 10000))
		want := make([]float32, len(q))
		must(t, DecodeLayer(c, layer, q, engineQHeads, tables, rows.EffectiveSeqLens, want, DecodeOptions{CPUThreads: 1}))
		for i := range want {
			if math.Abs(float64(outs[layer][i]-want[i])) > 1e-5 {
				t.Fatalf("layer %d out[%d] = %v, want %v", layer, i, outs[layer][i], want[i])
			}
		}
	}
	must(t, step.Commit())
	for i, id := range ids {
		if st, _ := e.RequestState(id); st != EngineRequestActive {
			continue
		}
		if l := seqLens(t, c, []uint64{id})[0]; l != rows.Positions[i]+1 {
			t.Fatalf("request %d: seq_len %d after the step, want %d", id, l, rows.Positions[i]+1)
		}
	}
}

func TestEngineDefaults(t *testing.T) {
	eq(t, "engine defaults", DefaultEngineConfig(), EngineConfig{RopeBase: 10000})
}

// Unscheduled mode: add, admit, steps until backpressure (which changes
// nothing), finish one request, and keep going with the other.
func TestEngineUnscheduledLoopWithBackpressure(t *testing.T) {
	cfg := small(2)
	cfg.MaxBlocks = 3
	c := newCache(t, cfg)
	defer c.Close()
	e := newEngine(t, c)
	defer e.Close()
	reqs := []uint64{1, 2}
	for _, id := range reqs {
		must(t, e.AddRequest(id))
		st, err := e.RequestState(id)
		must(t, err)
		eq(t, "state after add", st, EngineRequestWaiting)
		must(t, e.Admit(id))
	}
	seed := uint64(11)
	steps := 0
	var bp *Step
	for steps < 10 {
		step, err := e.BeginStep(reqs)
		must(t, err)
		if !step.Opened() {
			bp = step
			break
		}
		eq(t, "batch", step.Batch, uint32(2))
		runStep(t, e, step, reqs, &seed)
		steps++
	}
	// 3 blocks of 4 tokens: both rows fill their first block in 4 steps, and
	// the fifth step would need 2 new blocks with 1 free.
	eq(t, "steps before backpressure", steps, 4)
	if bp == nil || bp.Outcome != StepBackpressure || bp.NeededBlocks != 2 || bp.FreeBlocks != 1 || bp.TxID() != 0 {
		t.Fatalf("backpressure step %+v", bp)
	}
	asError(t, StepLayer(bp, 0, nil, nil, nil, []float32(nil)), InvalidState, "backpressure")
	eq(t, "lens after backpressure", seqLens(t, c, reqs), []int32{4, 4})
	m := engineMetrics(t, e)
	eq(t, "backpressure_count", m.U("backpressure_count"), uint64(1))
	eq(t, "completed_step_count", m.U("completed_step_count"), uint64(4))
	eq(t, "appended_token_count", m.U("appended_token_count"), uint64(8))
	eq(t, "open steps", m.U("open_step_transaction_count"), uint64(0))

	must(t, e.Finish(2))
	st, err := e.RequestState(2)
	must(t, err)
	eq(t, "finished", st, EngineRequestFinished)
	for i := 0; i < 5; i++ {
		step, err := e.BeginStep([]uint64{1})
		must(t, err)
		if !step.Opened() {
			t.Fatalf("step %d: backpressure after finishing request 2", i)
		}
		runStep(t, e, step, []uint64{1}, &seed)
	}
	eq(t, "len of request 1", seqLens(t, c, []uint64{1}), []int32{9})
	must(t, e.Cancel(1))
	m = engineMetrics(t, e)
	eq(t, "finished/cancelled", [2]uint64{m.U("finished_request_count"), m.U("cancelled_request_count")}, [2]uint64{1, 1})
	cm, err := c.Metrics()
	must(t, err)
	eq(t, "used blocks at the end", cm.U("used_blocks"), uint64(0))
	must(t, e.Validate())
}

// A failing layer aborts the whole step; an early commit leaves it open; the
// binding refuses wrong lengths before the call.
func TestEngineStepErrors(t *testing.T) {
	c := newCache(t, small(2))
	defer c.Close()
	e := newEngine(t, c)
	defer e.Close()
	must(t, e.AddRequest(1))
	must(t, e.Admit(1))
	_, err := e.BeginStep([]uint64{7})
	asError(t, err, NotFound, "7")
	_, err = e.BeginStep([]uint64{1, 1})
	asError(t, err, InvalidArgument, "1")
	_, err = e.BeginStep(nil)
	asError(t, err, InvalidArgument, "")

	seed := uint64(5)
	step, err := e.BeginStep([]uint64{1})
	must(t, err)
	q, kv, out := noise(&seed, engineQHeads*8), noise(&seed, 16), make([]float32, engineQHeads*8)
	asError(t, StepLayer(step, 0, q[:8], kv, kv, out), InvalidArgument, "q/out")
	asError(t, StepLayer(step, 0, make([]uint16, len(q)), make([]uint16, 16), make([]uint16, 16), make([]uint16, len(q))),
		InvalidArgument, "element type")
	eq(t, "open after binding refusals", engineMetrics(t, e).U("open_step_transaction_count"), uint64(1))
	must(t, StepLayer(step, 0, q, kv, kv, out))
	asError(t, step.Commit(), InvalidState, "layer")
	eq(t, "still open after early commit", engineMetrics(t, e).U("open_step_transaction_count"), uint64(1))
	before := engineMetrics(t, e).U("transaction_abort_count")
	asError(t, StepLayer(step, 0, q, kv, kv, out), InvalidArgument, "layer")
	m := engineMetrics(t, e)
	eq(t, "aborted by the failure", m.U("transaction_abort_count"), before+1)
	eq(t, "no open step", m.U("open_step_transaction_count"), uint64(0))
	eq(t, "seq_len unchanged", seqLens(t, c, []uint64{1}), []int32{0})
	var fe *Error
	if err := step.Commit(); !errors.As(err, &fe) {
		t.Fatalf("commit after abort: %v", err)
	}

	// Explicit abort.
	step, err = e.BeginStep([]uint64{1})
	must(t, err)
	must(t, step.Abort())
	asError(t, step.Abort(), InvalidState, "")
	eq(t, "seq_len after abort", seqLens(t, c, []uint64{1}), []int32{0})
	must(t, e.Validate())
}

func TestEngineLifecycleErrors(t *testing.T) {
	c := newCache(t, small(2))
	defer c.Close()
	bad := DefaultEngineConfig()
	bad.NumQHeads = 3
	_, err := NewEngine(c, bad)
	asError(t, err, InvalidArgument, "num_q_heads")
	bad = DefaultEngineConfig()
	bad.RopeBase = 0
	_, err = NewEngine(c, bad)
	asError(t, err, InvalidArgument, "rope_base")

	_, err = NewEngine(nil, DefaultEngineConfig())
	asError(t, err, InvalidArgument, "cache")

	e := newEngine(t, c)
	asError(t, e.Admit(5), NotFound, "5")
	must(t, e.AddRequest(5))
	must(t, e.Cancel(5))
	asError(t, e.AddRequest(5), InvalidState, "5")
	asError(t, e.Finish(5), InvalidState, "5")
	_, err = e.Snapshot(0, nil)
	asError(t, err, InvalidState, "not scheduler-managed")
	asError(t, Prefill(e, 5, make([]float32, 31), make([]float32, 32)), InvalidArgument, "k")
	st, err := e.RequestState(99)
	must(t, err)
	eq(t, "unknown id", st, EngineRequestUnknown)

	// Closing the cache closes its engine first.
	c.Close()
	asError(t, e.AddRequest(6), InvalidState, "engine is closed")
	_, err = e.Metrics()
	asError(t, err, InvalidState, "engine is closed")
	e.Close()
	_, err = NewEngine(c, DefaultEngineConfig())
	asError(t, err, InvalidState, "cache is closed")
}

// specs of TestEngineSchedulerManagedLoop: lifetimes 2, 2 and 3 blocks of 4.
var managedSpecs = []RequestSpec{
	{ID: 1, InitialContextTokens: 5, MaxNewTokens: 3, SubmissionOrder: 0},
	{ID: 2, MaxNewTokens: 8, SubmissionOrder: 1},
	{ID: 3, MaxNewTokens: 9, SubmissionOrder: 2},
}

// Scheduler-managed mode: snapshot (with the caller's fairness counters) ->
// plan -> apply_decision -> prefill admitted contexts -> step the runnable
// rows, until every request finished by itself.
func TestEngineSchedulerManagedLoop(t *testing.T) {
	cfg := small(2)
	cfg.MaxBlocks = 6
	c := newCache(t, cfg)
	defer c.Close()
	e := newEngine(t, c)
	defer e.Close()
	s := newScheduler(t, 4, 4)
	defer s.Close()
	context := map[uint64]uint32{}
	for _, spec := range managedSpecs {
		must(t, e.Submit(spec))
		context[spec.ID] = spec.InitialContextTokens
	}
	eq(t, "scheduler_managed", engineMetrics(t, e).U("scheduler_managed"), uint64(1))
	asError(t, e.AddRequest(9), InvalidState, "scheduler-managed")

	fair := map[uint64]*Fairness{}
	for _, spec := range managedSpecs {
		fair[spec.ID] = &Fairness{ID: spec.ID}
	}
	seed := uint64(21)
	kv := int(cfg.NumLayers * cfg.NumKVHeads * cfg.HeadDim)
	iterations := 0
	for ; engineMetrics(t, e).U("finished_request_count") < 3 && iterations < 100; iterations++ {
		var counters []Fairness
		for _, spec := range managedSpecs {
			if st, _ := e.RequestState(spec.ID); st == EngineRequestWaiting || st == EngineRequestActive {
				counters = append(counters, *fair[spec.ID])
			}
		}
		snap, err := e.Snapshot(uint64(iterations), counters)
		must(t, err)
		info, err := snap.Info()
		must(t, err)
		eq(t, "snapshot version", info.Version, engineMetrics(t, e).U("state_version"))
		d, err := s.Plan(snap)
		must(t, err)
		snap.Close()
		must(t, e.ApplyDecision(s, d))
		for _, id := range ids(t, d, DecisionAdmit) {
			for i := uint32(0); i < context[id]; i++ {
				must(t, Prefill(e, id, noise(&seed, kv), noise(&seed, kv)))
			}
			asError(t, Prefill(e, id, noise(&seed, kv), noise(&seed, kv)), InvalidState, "context tokens")
		}
		run := ids(t, d, DecisionRunnable)
		if iterations == 0 {
			eq(t, "first runnable", run, []uint64{1, 2})
			eq(t, "first waiting", ids(t, d, DecisionWaiting), []uint64{3})
			m := engineMetrics(t, e)
			eq(t, "committed_blocks", m.U("committed_blocks"), uint64(4))
			eq(t, "prefill_token_count", m.U("prefill_token_count"), uint64(5))
			// Wrong rows are refused: they must be the decision's runnable ids.
			_, err := e.BeginStep([]uint64{2, 1})
			asError(t, err, InvalidArgument, "row 0 must be request 1")
		}
		if len(run) > 0 {
			step, err := e.BeginStep(run)
			must(t, err)
			runStep(t, e, step, run, &seed)
		}
		// The caller's fairness counters (docs/semantics.md S9).
		for _, id := range ids(t, d, DecisionWaiting) {
			fair[id].WaitSteps++
			fair[id].SkipCount++
		}
		for _, id := range run {
			fair[id].ServiceWaitSteps = 0
		}
		for _, id := range ids(t, d, DecisionDeferred) {
			fair[id].ServiceWaitSteps++
		}
		d.Close()
		must(t, e.Validate())
	}
	m := engineMetrics(t, e)
	eq(t, "finished", m.U("finished_request_count"), uint64(3))
	eq(t, "active", m.U("active_request_count"), uint64(0))
	eq(t, "appended tokens", m.U("appended_token_count"), uint64(3+8+9))
	eq(t, "committed blocks at the end", m.U("committed_blocks"), uint64(0))
	eq(t, "applied decisions", m.U("applied_decision_count"), uint64(iterations))
	cm, err := c.Metrics()
	must(t, err)
	eq(t, "free blocks at the end", cm.U("free_blocks"), uint64(6))
	for _, spec := range managedSpecs {
		st, err := e.RequestState(spec.ID)
		must(t, err)
		eq(t, "final state", st, EngineRequestFinished)
	}
}

// apply_decision refuses stale and mismatched decisions and changes nothing
// but stale_decision_count.
func TestEngineApplyDecisionRefusals(t *testing.T) {
	c := newCache(t, small(1))
	defer c.Close()
	e := newEngine(t, c)
	defer e.Close()
	s := newScheduler(t, 4, 4)
	defer s.Close()
	must(t, e.Submit(RequestSpec{ID: 1, MaxNewTokens: 4, SubmissionOrder: 0}))
	must(t, e.Submit(RequestSpec{ID: 2, MaxNewTokens: 4, SubmissionOrder: 1}))
	asError(t, e.Submit(RequestSpec{ID: 1, MaxNewTokens: 4, SubmissionOrder: 2}), AlreadyExists, "request 1")
	asError(t, e.Submit(RequestSpec{ID: 3, MaxNewTokens: 4, SubmissionOrder: 1}), AlreadyExists, "submission_order 1")
	asError(t, e.Submit(RequestSpec{ID: 3, MaxNewTokens: 4, SubmissionOrder: 5, PrefixID: "missing"}), NotFound, "missing")

	plan := func() *Decision {
		snap, err := e.Snapshot(0, nil)
		must(t, err)
		defer snap.Close()
		d, err := s.Plan(snap)
		must(t, err)
		return d
	}
	refused := func(sch *Scheduler, d *Decision, text string) {
		t.Helper()
		before := engineMetrics(t, e)
		asError(t, e.ApplyDecision(sch, d), StaleHandle, text)
		after := engineMetrics(t, e)
		eq(t, "stale_decision_count", after.U("stale_decision_count"), before.U("stale_decision_count")+1)
		for _, name := range []string{"state_version", "applied_decision_count", "waiting_request_count", "active_request_count"} {
			eq(t, name, after.U(name), before.U(name))
		}
	}
	old := plan()
	must(t, e.Submit(RequestSpec{ID: 3, MaxNewTokens: 4, SubmissionOrder: 2}))
	refused(s, old, "planned from engine state version")
	old.Close()

	other := newScheduler(t, 3, 3)
	defer other.Close()
	d := plan()
	defer d.Close()
	refused(other, d, "configuration differs")

	_, err := e.Snapshot(0, []Fairness{{ID: 1}, {ID: 1}})
	asError(t, err, InvalidArgument, "twice")
	_, err = e.Snapshot(0, []Fairness{{ID: 77}})
	asError(t, err, NotFound, "request 77")

	must(t, e.ApplyDecision(s, d))
	eq(t, "active after apply", engineMetrics(t, e).U("active_request_count"), uint64(3))
	refused(s, d, "state version")

	closed := plan()
	closed.Close()
	asError(t, e.ApplyDecision(s, closed), InvalidState, "decision is closed")
}

// A prefix registered through the engine serves a prefixed request; it can be
// evicted once no request is waiting or active.
func TestEnginePrefixes(t *testing.T) {
	cfg := small(2)
	cfg.PrefixCacheCapacityBlocks = 2
	c := newCache(t, cfg)
	defer c.Close()
	e := newEngine(t, c)
	defer e.Close()
	s := newScheduler(t, 4, 4)
	defer s.Close()
	seed := uint64(8)
	block := int(cfg.NumLayers * cfg.NumKVHeads * cfg.BlockSize * cfg.HeadDim)
	asError(t, EngineRegisterPrefix(e, "sys", noise(&seed, block-1), noise(&seed, block-1)), InvalidArgument, "k_blocks")
	must(t, EngineRegisterPrefix(e, "sys", noise(&seed, block), noise(&seed, block)))
	// prefix_blocks 0 is filled in from the registered prefix.
	must(t, e.Submit(RequestSpec{ID: 1, InitialContextTokens: 4, MaxNewTokens: 2, SubmissionOrder: 0, PrefixID: "sys"}))
	asError(t, EngineRegisterPrefix(e, "late", noise(&seed, block), noise(&seed, block)), InvalidState, "before the first submission")
	asError(t, e.EvictPrefix("sys"), InvalidState, "")
	for i := 0; i < 2; i++ {
		snap, err := e.Snapshot(uint64(i), nil)
		must(t, err)
		d, err := s.Plan(snap)
		must(t, err)
		snap.Close()
		must(t, e.ApplyDecision(s, d))
		run := ids(t, d, DecisionRunnable)
		eq(t, "runnable", run, []uint64{1})
		step, err := e.BeginStep(run)
		must(t, err)
		runStep(t, e, step, run, &seed)
		d.Close()
	}
	st, err := e.RequestState(1)
	must(t, err)
	eq(t, "prefixed request finished", st, EngineRequestFinished)
	info, err := c.PrefixInfo("sys")
	must(t, err)
	eq(t, "prefix refs", info.RefCount, uint32(0))
	must(t, e.EvictPrefix("sys"))
	_, err = c.PrefixInfo("sys")
	asError(t, err, NotFound, "sys")
	must(t, e.Validate())
}

// Forgotten engines, schedulers, snapshots and decisions are freed by their
// finalizers (run under the race detector / ASan this also checks ordering).
func TestEngineFinalizerBackstop(t *testing.T) {
	c := newCache(t, small(1))
	defer c.Close()
	for i := 0; i < 20; i++ {
		e := newEngine(t, c)
		must(t, e.AddRequest(uint64(i)))
		s := newScheduler(t, 2, 2)
		snap := newSnap(t, 4, 8, 8)
		d, err := s.Plan(snap)
		must(t, err)
		_ = d
	}
	runtime.GC()
	runtime.GC()
	// The cache is still usable, and engine finalizers unlinked themselves.
	must(t, c.AddRequest(1000))
	c.mu.Lock()
	n := len(c.engines)
	c.mu.Unlock()
	if n > 20 {
		t.Fatalf("%d engines linked", n)
	}
}
