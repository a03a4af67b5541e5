package flashdec

import (
	"math"
	"testing"
	"unsafe"
)

// Several tokens per row (0.2): multi-token transactions, keep, truncate,
// engine multi-token steps, bulk prefill, and the dense reference with query
// tokens and variants.

// storedCache is a small(2) cache over C memory the test reads: K and V,
// packed token-major [layers, max_blocks, heads, block_size, dim].
type storedCache struct {
	*Cache
	k, v []float32
}

// twinCaches are two storedCaches; when the test ends they are closed, then
// their storage is freed.
func twinCaches(t *testing.T) (a, b storedCache) {
	t.Helper()
	arena := &cArena{}
	t.Cleanup(arena.free) // cleanups run last-registered first: after the Close calls
	cfg := small(2)
	elems := int(cfg.NumLayers*cfg.MaxBlocks*cfg.NumKVHeads*cfg.BlockSize) * int(cfg.HeadDim)
	twins := make([]storedCache, 2)
	for i := range twins {
		cfg.KStorage, cfg.VStorage = arena.alloc(elems*4), arena.alloc(elems*4)
		c := newCache(t, cfg)
		t.Cleanup(c.Close)
		twins[i] = storedCache{c, unsafe.Slice((*float32)(cfg.KStorage), elems), unsafe.Slice((*float32)(cfg.VStorage), elems)}
	}
	return twins[0], twins[1]
}

// stored is a request's committed K (or V) of every layer, token by token:
// [layers, seq_len, heads, dim].
func (c storedCache) stored(t *testing.T, storage []float32, id uint64) []float32 {
	t.Helper()
	cfg := c.Config()
	tables, lens, _, err := c.Export([]uint64{id}, 0)
	must(t, err)
	bs, h, d := int(cfg.BlockSize), int(cfg.NumKVHeads), int(cfg.HeadDim)
	var out []float32
	for layer := 0; layer < int(cfg.NumLayers); layer++ {
		for tok := 0; tok < int(lens[0]); tok++ {
			b := int(tables[tok/bs]) + layer*int(cfg.MaxBlocks)
			for head := 0; head < h; head++ {
				at := ((b*h+head)*bs + tok%bs) * d
				out = append(out, storage[at:at+d]...)
			}
		}
	}
	return out
}

// sameStored reports whether request id holds the same K and V bits in a and b.
func sameStored(t *testing.T, a, b storedCache, id uint64) bool {
	t.Helper()
	return equalSlice(a.stored(t, a.k, id), b.stored(t, b.k, id)) && equalSlice(a.stored(t, a.v, id), b.stored(t, b.v, id))
}

// twoRequests is a small(2) cache with requests 1 and 2.
func twoRequests(t *testing.T) *Cache {
	t.Helper()
	c := newCache(t, small(2))
	must(t, c.AddRequest(1))
	must(t, c.AddRequest(2))
	return c
}

func writeAll(t *testing.T, tx *Tx, tokens int, seed *uint64) {
	t.Helper()
	for layer := uint32(0); layer < 2; layer++ {
		must(t, WriteLayer(tx, layer, noise(seed, tokens*16), noise(seed, tokens*16)))
	}
}

func metric(t *testing.T, c *Cache, name string) uint64 {
	t.Helper()
	m, err := c.Metrics()
	must(t, err)
	return m.U(name)
}

func TestBeginMultiPositionsBlocksAndTokenIndptr(t *testing.T) {
	c := twoRequests(t)
	defer c.Close()
	seed := uint64(1)
	tx, err := c.Begin([]uint64{1})
	must(t, err)
	writeAll(t, tx, 1, &seed)
	must(t, tx.Commit())

	if needed, _, err := c.BlocksNeededMulti([]uint64{1, 2}, []uint32{4, 2}); err != nil || needed != 2 {
		t.Fatalf("BlocksNeededMulti: %d, %v", needed, err)
	}
	if _, _, err := c.BlocksNeededMulti([]uint64{1, 2}, []uint32{4}); err == nil {
		t.Fatal("BlocksNeededMulti with one count for two rows succeeded")
	}
	tx, err = c.BeginMulti([]uint64{1, 2}, []uint32{4, 2})
	must(t, err)
	info, err := tx.Info()
	must(t, err)
	if info.Batch != 2 || info.TokenCount != 6 || info.NewBlocks != 2 || info.MaxBlocksPerSeq != 2 {
		t.Fatalf("info %+v", info)
	}
	rows, err := tx.Rows()
	must(t, err)
	toks, err := tx.Tokens()
	must(t, err)
	if !equalSlice(rows.EffectiveSeqLens, []int32{5, 2}) || !equalSlice(toks.Positions, []int32{1, 2, 3, 4, 0, 1}) ||
		!equalSlice(toks.Offsets, []int32{1, 2, 3, 0, 0, 1}) {
		t.Fatalf("rows %+v tokens %+v", rows, toks)
	}
	tables, stride, err := tx.BlockTables(0)
	must(t, err)
	for i, row := range []int{0, 0, 0, 0, 1, 1} {
		if toks.BlockIDs[i] != tables[row*int(stride)+int(toks.Positions[i])/4] {
			t.Fatalf("token %d: block %d, tables %v", i, toks.BlockIDs[i], tables)
		}
	}
	indptr := []int32{-7, -7, -7}
	must(t, tx.TokenIndptrAsync(unsafe.Pointer(&indptr[0]), nil))
	if !equalSlice(indptr, []int32{0, 4, 6}) {
		t.Fatalf("token indptr %v", indptr)
	}
	asError(t, tx.TokenIndptrAsync(nil, nil), InvalidArgument, "token_indptr")
	// The layer writes take the 6 packed tokens, not one per row.
	expectInvalid(t, WriteLayer(tx, 0, noise(&seed, 32), noise(&seed, 32)), "expected 96 elements (6 x 2 x 8)")
	writeAll(t, tx, 6, &seed)
	must(t, tx.Commit())
	if got := seqLens(t, c, []uint64{1, 2}); !equalSlice(got, []int32{5, 2}) {
		t.Fatalf("seq_lens %v", got)
	}
	must(t, c.Validate())
	_, err = tx.Tokens()
	asError(t, err, InvalidState, "committed")
}

func TestBeginMultiRefusals(t *testing.T) {
	c := twoRequests(t)
	defer c.Close()
	_, err := c.BeginMulti([]uint64{1, 2}, []uint32{3, 0})
	asError(t, err, InvalidArgument, "token_counts[1] is 0: each row appends at least one token")
	_, err = c.BeginMulti([]uint64{1, 2}, []uint32{3})
	expectInvalid(t, err, "token_counts: expected 2 entries")
	_, err = c.BeginMulti([]uint64{1, 2}, []uint32{30, 3})
	asError(t, err, OutOfBlocks, "")
	if metric(t, c, "capacity_failure_count") != 1 || metric(t, c, "free_blocks") != 8 || metric(t, c, "open_transaction_count") != 0 {
		t.Fatal("a refused begin changed the cache")
	}
}

func TestCommitKeepDropsTokensAndBlocks(t *testing.T) {
	c := twoRequests(t)
	defer c.Close()
	seed := uint64(2)
	tx, err := c.BeginMulti([]uint64{1, 2}, []uint32{5, 3})
	must(t, err)
	writeAll(t, tx, 8, &seed)
	asError(t, tx.CommitKeep([]uint32{6, 3}), InvalidArgument, "keep_counts[0]")
	asError(t, tx.CommitKeep([]uint32{1}), InvalidArgument, "")
	if info, err := tx.Info(); err != nil || info.NextLayer != 2 {
		t.Fatalf("transaction not open and unchanged: %+v %v", info, err)
	}
	must(t, tx.CommitKeep([]uint32{2, 3}))
	tables, lens, _, err := c.Export([]uint64{1, 2}, 2)
	must(t, err)
	if !equalSlice(lens, []int32{2, 3}) || tables[1] != -1 || tables[3] != -1 {
		t.Fatalf("tables %v lens %v", tables, lens)
	}
	if metric(t, c, "free_blocks") != 6 || metric(t, c, "transaction_rollback_block_count") != 1 || metric(t, c, "transaction_commit_count") != 1 {
		t.Fatal("keep did not return the dropped block")
	}
	asError(t, tx.CommitKeep([]uint32{2, 3}), InvalidState, "committed")
	must(t, c.Validate())
}

func TestTruncate(t *testing.T) {
	c := twoRequests(t)
	defer c.Close()
	seed := uint64(3)
	tx, err := c.BeginMulti([]uint64{1, 2}, []uint32{7, 2})
	must(t, err)
	writeAll(t, tx, 9, &seed)
	must(t, tx.Commit())
	free, freed := metric(t, c, "free_blocks"), metric(t, c, "free_count")
	must(t, c.Truncate([]uint64{1, 2}, []int32{3, 2}))
	tables, lens, _, err := c.Export([]uint64{1, 2}, 2)
	must(t, err)
	if !equalSlice(lens, []int32{3, 2}) || tables[1] != -1 || metric(t, c, "free_blocks") != free+1 || metric(t, c, "free_count") != freed+1 {
		t.Fatalf("tables %v lens %v", tables, lens)
	}
	version, err := c.StateVersion()
	must(t, err)
	must(t, c.Truncate([]uint64{1}, []int32{3})) // the current length: nothing changes
	asError(t, c.Truncate([]uint64{1}, []int32{4}), InvalidArgument, "seq_lens[0] = 4 is outside [0, 3]")
	asError(t, c.Truncate([]uint64{9}, []int32{0}), NotFound, "9")
	expectInvalid(t, c.Truncate([]uint64{1, 2}, []int32{0}), "seq_lens: expected 2 entries")
	if v, _ := c.StateVersion(); v != version {
		t.Fatalf("state version %d -> %d", version, v)
	}
	tx, err = c.Begin([]uint64{2})
	must(t, err)
	asError(t, c.Truncate([]uint64{1}, []int32{0}), InvalidState, "")
	must(t, tx.Abort())

	cfg := small(2)
	cfg.PrefixCacheCapacityBlocks = 2
	p := newCache(t, cfg)
	defer p.Close()
	must(t, RegisterPrefix(p, "sys", make([]float32, 128), make([]float32, 128)))
	must(t, p.AddRequest(1))
	must(t, p.AttachPrefix(1, "sys"))
	tx, err = p.Begin([]uint64{1})
	must(t, err)
	writeAll(t, tx, 1, &seed)
	must(t, tx.Commit())
	asError(t, p.Truncate([]uint64{1}, []int32{3}), InvalidArgument, "would cut into the attached prefix")
	must(t, p.Truncate([]uint64{1}, []int32{4}))
}

func mtEngine(t *testing.T, c *Cache) *Engine {
	t.Helper()
	cfg := DefaultEngineConfig()
	cfg.NumQHeads, cfg.RotaryDim, cfg.CPUThreads = engineQHeads, 8, 1
	e, err := NewEngine(c, cfg)
	must(t, err)
	for _, id := range []uint64{1, 2} {
		must(t, e.AddRequest(id))
		must(t, e.Admit(id))
	}
	return e
}

// pick gathers the rows idx (of width w) of x.
func pick(x []float32, idx []int, w int) []float32 {
	var out []float32
	for _, i := range idx {
		out = append(out, x[i*w:(i+1)*w]...)
	}
	return out
}

// Row 1 appends 3 tokens and row 2 two in one step; the other engine runs
// them as three one-token steps: the same attention outputs and cache.
func TestEngineMultiTokenStepEqualsOneTokenSteps(t *testing.T) {
	ca, cb := twinCaches(t)
	seed := uint64(4)
	ctx := noise(&seed, 2*32) // two context tokens of request 1: [layers, heads, dim] each
	inputs := make([][3][]float32, 2)
	for layer := range inputs {
		inputs[layer] = [3][]float32{noise(&seed, 5*32), noise(&seed, 80), noise(&seed, 80)}
	}
	multi, single := mtEngine(t, ca.Cache), mtEngine(t, cb.Cache)
	for _, e := range []*Engine{multi, single} {
		for tok := 0; tok < 2; tok++ {
			must(t, Prefill(e, 1, ctx[tok*32:(tok+1)*32], ctx[tok*32:(tok+1)*32]))
		}
	}
	step, err := multi.BeginStepMulti([]uint64{1, 2}, []uint32{3, 2})
	must(t, err)
	if !step.Opened() || step.Batch != 2 || step.Tokens != 5 {
		t.Fatalf("step %+v", step)
	}
	want := make([][]float32, 2)
	for layer, in := range inputs {
		want[layer] = make([]float32, 5*32)
		must(t, StepLayer(step, uint32(layer), in[0], in[1], in[2], want[layer]))
	}
	must(t, step.Commit())
	for _, idx := range [][]int{{0, 3}, {1, 4}, {2}} {
		step, err := single.BeginStep([]uint64{1, 2}[:len(idx)])
		must(t, err)
		for layer, in := range inputs {
			out := make([]float32, len(idx)*32)
			must(t, StepLayer(step, uint32(layer), pick(in[0], idx, 32), pick(in[1], idx, 16), pick(in[2], idx, 16), out))
			for i, w := range pick(want[layer], idx, 32) {
				if math.Abs(float64(out[i]-w)) > 1e-5*(1+math.Abs(float64(w))) {
					t.Fatalf("layer %d tokens %v: out[%d] = %v, multi-token step %v", layer, idx, i, out[i], w)
				}
			}
		}
		must(t, step.Commit())
	}
	for _, id := range []uint64{1, 2} {
		if !sameStored(t, ca, cb, id) {
			t.Fatalf("request %d: stored K/V differ", id)
		}
	}
	if got := seqLens(t, ca.Cache, []uint64{1, 2}); !equalSlice(got, []int32{5, 2}) {
		t.Fatalf("seq_lens %v", got)
	}
	if engineMetrics(t, multi).U("appended_token_count") != 5 {
		t.Fatal("appended_token_count")
	}
}

func TestEngineCommitStepKeepAndRefusals(t *testing.T) {
	c := newCache(t, small(2))
	defer c.Close()
	e := mtEngine(t, c)
	_, err := e.BeginStepMulti([]uint64{1, 2}, []uint32{0, 2})
	asError(t, err, InvalidArgument, "token_counts[0]")
	_, err = e.BeginStepMulti([]uint64{1, 2}, []uint32{1, 2, 3})
	expectInvalid(t, err, "token_counts: expected 2 entries")
	seed := uint64(5)
	step, err := e.BeginStepMulti([]uint64{1, 2}, []uint32{5, 2})
	must(t, err)
	if step.NeededBlocks != 3 {
		t.Fatalf("needed blocks %d", step.NeededBlocks)
	}
	out := make([]float32, 7*32)
	expectInvalid(t, StepLayer(step, 0, noise(&seed, 64), noise(&seed, 32), noise(&seed, 32), out[:64]), "k: expected 112 elements")
	for layer := uint32(0); layer < 2; layer++ {
		must(t, StepLayer(step, layer, noise(&seed, 7*32), noise(&seed, 112), noise(&seed, 112), out))
	}
	asError(t, step.CommitKeep([]uint32{6, 1}), InvalidArgument, "keep_counts[0]")
	if engineMetrics(t, e).U("open_step_transaction_count") != 1 {
		t.Fatal("a refused keep closed the step")
	}
	must(t, step.CommitKeep([]uint32{3, 0}))
	if got := seqLens(t, c, []uint64{1, 2}); !equalSlice(got, []int32{3, 0}) {
		t.Fatalf("seq_lens %v", got)
	}
	if metric(t, c, "used_blocks") != 1 || metric(t, c, "transaction_rollback_block_count") != 2 {
		t.Fatal("dropped blocks were not returned")
	}
	asError(t, step.CommitKeep([]uint32{1, 1}), InvalidState, "")
	must(t, e.Validate())
}

func TestEnginePrefillTokensEqualsTokenByToken(t *testing.T) {
	ca, cb := twinCaches(t)
	seed := uint64(6)
	k, v := noise(&seed, 2*5*16), noise(&seed, 2*5*16) // [layers, 5 tokens, heads, dim]
	token := func(x []float32, j int) []float32 {
		return append(append([]float32{}, x[j*16:(j+1)*16]...), x[(5+j)*16:(6+j)*16]...)
	}
	bulk, single := mtEngine(t, ca.Cache), mtEngine(t, cb.Cache)
	must(t, PrefillTokens(bulk, 1, k, v))
	for j := 0; j < 5; j++ {
		must(t, Prefill(single, 1, token(k, j), token(v, j)))
	}
	if !sameStored(t, ca, cb, 1) {
		t.Fatal("bulk prefill stored other K/V than token by token")
	}
	if engineMetrics(t, bulk).U("prefill_token_count") != 5 || !equalSlice(seqLens(t, ca.Cache, []uint64{1}), []int32{5}) {
		t.Fatal("prefill_token_count / seq_len")
	}
	asError(t, PrefillTokens(bulk, 9, k, v), NotFound, "")
	expectInvalid(t, PrefillTokens(bulk, 1, k[:40], v[:40]), "multiples of num_layers * num_kv_heads * head_dim = 32")
}

func TestReferenceAttentionMatchesPagedDecode(t *testing.T) {
	p := newPlanProblem(40).multiToken(41)
	paged := make([]float32, len(p.q))
	must(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, paged, DecodeOptions{QIndptr: mtIndptr}))
	// The same K/V laid out densely: [batch, hkv, 8, d].
	hkv, d, bs := int(p.hkv), int(p.d), int(p.bs)
	dk, dv := make([]float32, 2*hkv*8*d), make([]float32, 2*hkv*8*d)
	for r := 0; r < 2; r++ {
		for tok := 0; tok < int(p.lens[r]); tok++ {
			for h := 0; h < hkv; h++ {
				src := ((int(p.tables[r*2+tok/bs])*hkv+h)*bs + tok%bs) * d
				dst := ((r*hkv+h)*8 + tok) * d
				copy(dk[dst:dst+d], p.k[src:src+d])
				copy(dv[dst:dst+d], p.v[src:src+d])
			}
		}
	}
	out := make([]float32, len(p.q))
	must(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out, ReferenceOptions{QIndptr: mtIndptr}))
	for i := range out {
		if math.Abs(float64(out[i]-paged[i])) > 1e-5*(1+math.Abs(float64(paged[i]))) {
			t.Fatalf("out[%d] = %v, paged decode %v", i, out[i], paged[i])
		}
	}
	// A window of 1: each query sees only its own position, so out = V there.
	must(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out, ReferenceOptions{QIndptr: mtIndptr, SlidingWindow: 1}))
	for tok, rp := range [][2]int{{0, 3}, {0, 4}, {1, 0}, {1, 1}, {1, 2}} {
		for h := 0; h < int(p.hq); h++ {
			at := ((rp[0]*hkv+h/2)*8 + rp[1]) * d
			got := out[(tok*int(p.hq)+h)*d:][:d]
			for i := range got {
				if math.Abs(float64(got[i]-dv[at+i])) > 1e-6 {
					t.Fatalf("window 1: token %d head %d: %v vs %v", tok, h, got, dv[at:at+d])
				}
			}
		}
	}
	// One token per row and no variant: the bits of the dense reference.
	a, b := make([]float32, 2*32), make([]float32, 2*32)
	must(t, ReferenceAttention(F32, p.q[:64], p.hq, dk, dv, p.hkv, p.d, p.lens, a, ReferenceOptions{}))
	must(t, ReferenceAttentionDense(F32, p.q[:64], p.hq, dk, dv, p.hkv, p.d, p.lens, 0, b))
	sameBits(t, "reference", a, b)
	// Refusals: the library's (NaN sink, negative window) and the binding's.
	nan := float32(math.NaN())
	asError(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out,
		ReferenceOptions{QIndptr: mtIndptr, Sinks: []float32{0, nan, 0, 0}}), InvalidArgument, "sinks")
	asError(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out,
		ReferenceOptions{QIndptr: mtIndptr, SlidingWindow: -1}), InvalidArgument, "sliding_window")
	expectInvalid(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out,
		ReferenceOptions{QIndptr: mtIndptr, Sinks: []float32{0, 0, 0}}), "sinks: expected 4 entries")
	expectInvalid(t, ReferenceAttention(F32, p.q, p.hq, dk, dv, p.hkv, p.d, p.lens, out, ReferenceOptions{}),
		"q/out: expected 64 elements")
}
