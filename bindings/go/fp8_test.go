package flashdec

import (
	"math"
	"testing"
	"unsafe"
)

// FP8 K/V from Go (issue 15, docs/semantics.md S1.1), on the CPU: the bytes
// an FP8 cache stores (exact values, saturation, infinities, NaN of both
// signs, -0, per-layer scales), set/get scales and their errors, the append
// primitives into FP8 pages, decode over an FP8 cache against the f32
// reference over the dequantised K/V, and the engine step against the same
// step by hand.

const (
	fpH, fpD, fpBS = 2, 8, 4
	fpToken        = fpH * fpD
)

// fp8Values are inputs whose codes at scale 1 are fp8E4M3Codes / fp8E5M2Codes.
var (
	negNaN       = math.Float32frombits(0xffc00000)
	fp8Values    = []float32{1, 1.5, 500, 1e6, -1e9, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), negNaN, float32(math.Copysign(0, -1)), 0, 2, -448, 0.25, 3, 4}
	fp8E4M3Codes = []uint8{0x38, 0x3c, 0x7e, 0x7e, 0xfe, 0x7e, 0xfe, 0x7f, 0x7f, 0x80, 0x00, 0x40, 0xfe, 0x28, 0x44, 0x48}
	fp8E5M2Codes = []uint8{0x3c, 0x3e, 0x60, 0x7b, 0xfb, 0x7b, 0xfb, 0x7f, 0x7f, 0x80, 0x00, 0x40, 0xdf, 0x34, 0x42, 0x44}
)

// fp8Cache is a 2-layer FP8 CPU cache over C memory the test reads (packed
// token-major bytes [layers, max_blocks, heads, block_size, dim]), closed
// and freed when the test ends.
type fp8Cache struct {
	*Cache
	k, v []uint8
}

func newFP8Cache(t *testing.T, dtype, input DType, kScales, vScales []float32) fp8Cache {
	t.Helper()
	arena := &cArena{}
	t.Cleanup(arena.free)
	cfg := DefaultCacheConfig()
	cfg.NumLayers, cfg.NumKVHeads, cfg.HeadDim, cfg.BlockSize, cfg.MaxBlocks = 2, fpH, fpD, fpBS, 16
	cfg.DType, cfg.InputDType, cfg.KScales, cfg.VScales = dtype, input, kScales, vScales
	n := int(cfg.NumLayers*cfg.MaxBlocks) * fpBS * fpToken
	cfg.KStorage, cfg.VStorage = arena.alloc(n), arena.alloc(n)
	c := newCache(t, cfg)
	t.Cleanup(c.Close)
	return fp8Cache{c, unsafe.Slice((*uint8)(cfg.KStorage), n), unsafe.Slice((*uint8)(cfg.VStorage), n)}
}

// layer is one layer's bytes of storage, [max_blocks, heads, block_size, dim].
func (c fp8Cache) layer(storage []uint8, layer int) []uint8 {
	n := int(c.cfg.MaxBlocks) * fpBS * fpToken
	return storage[layer*n : (layer+1)*n]
}

// tokenBytes are the [heads, dim] bytes of the token at (block, offset) of a layer.
func tokenBytes(layer []uint8, block, offset int32) []uint8 {
	var out []uint8
	for h := 0; h < fpH; h++ {
		at := ((int(block)*fpH+h)*fpBS + int(offset)) * fpD
		out = append(out, layer[at:at+fpD]...)
	}
	return out
}

func bf16Bits(x float32) uint16  { return uint16(math.Float32bits(x) >> 16) }
func bf16Value(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

func TestFP8ToFloat32(t *testing.T) {
	for _, c := range []struct {
		dtype DType
		bits  uint8
		want  float32
	}{{FP8E4M3, 0x7e, 448}, {FP8E4M3, 0xfe, -448}, {FP8E4M3, 0x38, 1}, {FP8E4M3, 0x01, 1.0 / 512}, {FP8E5M2, 0x7b, 57344},
		{FP8E5M2, 0x01, 1.0 / 65536}, {FP8E5M2, 0x7c, float32(math.Inf(1))}, {FP8E5M2, 0xfc, float32(math.Inf(-1))}} {
		if got := FP8ToFloat32(c.dtype, c.bits); got != c.want {
			t.Fatalf("FP8ToFloat32(%d, %#x) = %v, want %v", c.dtype, c.bits, got, c.want)
		}
	}
	for _, nan := range [][2]int{{int(FP8E4M3), 0x7f}, {int(FP8E4M3), 0xff}, {int(FP8E5M2), 0x7d}, {int(F16), 0}} {
		if !math.IsNaN(float64(FP8ToFloat32(DType(nan[0]), uint8(nan[1])))) {
			t.Fatalf("FP8ToFloat32(%d, %#x) is not NaN", nan[0], nan[1])
		}
	}
	for i, x := range fp8Values { // the exactly representable inputs decode to themselves
		if x == 1 || x == 2 || x == 0.25 || x == 3 || x == 4 || x == -448 {
			if FP8ToFloat32(FP8E4M3, fp8E4M3Codes[i]) != x || FP8ToFloat32(FP8E5M2, fp8E5M2Codes[i]) != x {
				t.Fatalf("code of %v does not decode to it", x)
			}
		}
	}
	if FP8E4M3.Size() != 1 || BF16.Size() != 2 || !FP8E5M2.IsFP8() || F16.IsFP8() {
		t.Fatal("DType.Size / IsFP8")
	}
}

// Writes fp8Values (K) and their negation (V) into both layers, layer 1
// multiplied by its scales ((x * s) / s == x in FP32 here, so both layers
// store the same codes), and checks every byte.
func checkStoredCodes[T Elem](t *testing.T, dtype, input DType, codes []uint8, conv func(float32) T) {
	t.Helper()
	kScales, vScales := []float32{1, 2}, []float32{1, 0.25}
	c := newFP8Cache(t, dtype, input, kScales, vScales)
	if cfg := c.Config(); cfg.InputDType != input || cfg.ResolvedInputDType() != input || cfg.KScales != nil {
		t.Fatalf("Config: %+v", cfg)
	}
	ks, vs, err := c.KVScales()
	must(t, err)
	if !equalSlice(ks, kScales) || !equalSlice(vs, vScales) {
		t.Fatalf("KVScales = %v %v", ks, vs)
	}
	must(t, c.AddRequest(1))
	tx, err := c.Begin([]uint64{1})
	must(t, err)
	rows, err := tx.Rows()
	must(t, err)
	for layer := 0; layer < 2; layer++ {
		k, v := make([]T, fpToken), make([]T, fpToken)
		for i, x := range fp8Values {
			k[i], v[i] = conv(x*kScales[layer]), conv(-x*vScales[layer])
		}
		must(t, WriteLayer(tx, uint32(layer), k, v))
	}
	must(t, tx.Commit())
	neg := make([]uint8, len(codes))
	for i, code := range codes {
		neg[i] = code ^ 0x80
		if code == 0x7f {
			neg[i] = code // NaN of either sign stores 0x7f
		}
	}
	for layer := 0; layer < 2; layer++ {
		if got := tokenBytes(c.layer(c.k, layer), rows.BlockIDs[0], rows.Offsets[0]); !equalSlice(got, codes) {
			t.Fatalf("dtype %d input %d layer %d K: % x, want % x", dtype, input, layer, got, codes)
		}
		if got := tokenBytes(c.layer(c.v, layer), rows.BlockIDs[0], rows.Offsets[0]); !equalSlice(got, neg) {
			t.Fatalf("dtype %d input %d layer %d V: % x, want % x", dtype, input, layer, got, neg)
		}
	}
}

func TestFP8CacheStoresTheQuantisedBytes(t *testing.T) {
	identity := func(x float32) float32 { return x }
	checkStoredCodes(t, FP8E4M3, F32, fp8E4M3Codes, identity)
	checkStoredCodes(t, FP8E5M2, F32, fp8E5M2Codes, identity)
	checkStoredCodes(t, FP8E4M3, BF16, fp8E4M3Codes, bf16Bits) // every value here is a bf16 value
}

func TestFP8CacheScalesAndErrors(t *testing.T) {
	c := newFP8Cache(t, FP8E4M3, F32, nil, nil)
	ks, vs, err := c.KVScales()
	must(t, err)
	if !equalSlice(ks, []float32{1, 1}) || !equalSlice(vs, []float32{1, 1}) {
		t.Fatalf("default scales %v %v", ks, vs)
	}
	must(t, c.SetKVScales([]float32{0.25, 4}, []float32{2, 0.5}))
	for _, bad := range []float32{0, -1, float32(math.NaN()), float32(math.Inf(1))} {
		asError(t, c.SetKVScales([]float32{1, bad}, []float32{1, 1}), InvalidArgument, "k_scales[1]")
		asError(t, c.SetKVScales([]float32{1, 1}, []float32{bad, 1}), InvalidArgument, "v_scales[0]")
	}
	asError(t, c.SetKVScales([]float32{1}, []float32{1, 1}), InvalidArgument, "k_scales: expected 2 entries")
	ks, vs, err = c.KVScales()
	must(t, err)
	if !equalSlice(ks, []float32{0.25, 4}) || !equalSlice(vs, []float32{2, 0.5}) {
		t.Fatalf("scales after refusals %v %v", ks, vs)
	}
	// Later writes quantise with the new scales: 3 / 0.25 = 12 (0x54), 3 / 2 = 1.5 (0x3c).
	must(t, c.AddRequest(1))
	tx, err := c.Begin([]uint64{1})
	must(t, err)
	three := make([]float32, fpToken)
	for i := range three {
		three[i] = 3
	}
	must(t, WriteLayer(tx, 0, three, three))
	asError(t, c.SetKVScales([]float32{1, 1}, []float32{1, 1}), InvalidState, "") // a transaction is open
	must(t, WriteLayer(tx, 1, three, three))
	rows, err := tx.Rows()
	must(t, err)
	must(t, tx.Commit())
	k0, v0 := tokenBytes(c.layer(c.k, 0), rows.BlockIDs[0], rows.Offsets[0]), tokenBytes(c.layer(c.v, 0), rows.BlockIDs[0], rows.Offsets[0])
	if k0[0] != 0x54 || k0[fpToken-1] != 0x54 || v0[0] != 0x3c || v0[fpToken-1] != 0x3c {
		t.Fatalf("stored % x / % x", k0, v0)
	}
	// A cache that is not FP8: scales all 1, not settable; creation refusals.
	f16 := small(2)
	f16.DType = F16
	plain := newCache(t, f16)
	defer plain.Close()
	ks, _, err = plain.KVScales()
	must(t, err)
	if !equalSlice(ks, []float32{1, 1}) {
		t.Fatalf("non-FP8 scales %v", ks)
	}
	asError(t, plain.SetKVScales([]float32{1, 1}, []float32{1, 1}), InvalidState, "")
	f16.KScales = []float32{1, 1}
	_, err = NewCache(f16)
	asError(t, err, InvalidArgument, "k_scales")
	fp8 := f16
	fp8.DType, fp8.KScales = FP8E4M3, nil
	_, err = NewCache(fp8) // InputDType DTypeDefault: an FP8 cache needs a compute type
	asError(t, err, InvalidArgument, "input_dtype")
	fp8.InputDType, fp8.VScales = BF16, []float32{math.Float32frombits(0x7fc00000), 1}
	_, err = NewCache(fp8)
	asError(t, err, InvalidArgument, "v_scales[0]")
	fp8.VScales = []float32{1, 1, 1}
	_, err = NewCache(fp8)
	asError(t, err, InvalidArgument, "v_scales: expected 2 entries")
	// Layer writes take the input type, not FP8 bits.
	must(t, c.AddRequest(2))
	tx, err = c.Begin([]uint64{2})
	must(t, err)
	asError(t, WriteLayer(tx, 0, make([]uint8, fpToken), make([]uint8, fpToken)), InvalidArgument, "Go element type")
	must(t, tx.Abort())
}

func TestKVAppendTypedIntoFP8Pages(t *testing.T) {
	const blocks = 3
	pages := KVPages[uint8]{K: make([]uint8, blocks*fpBS*fpToken), V: make([]uint8, blocks*fpBS*fpToken), NumKVHeads: fpH, HeadDim: fpD,
		BlockSize: fpBS, Layout: TokenMajor}
	k, v := make([]float32, fpToken), make([]float32, fpToken)
	for i, x := range fp8Values {
		k[i], v[i] = x*0.5, x*4
	}
	must(t, KVAppendTyped(F32, FP8E5M2, pages, k, v, []int32{2}, []int32{1}, AppendOptions{KScale: 0.5, VScale: 4}))
	if got := tokenBytes(pages.K, 2, 1); !equalSlice(got, fp8E5M2Codes) {
		t.Fatalf("K % x", got)
	}
	if got := tokenBytes(pages.V, 2, 1); !equalSlice(got, fp8E5M2Codes) {
		t.Fatalf("V % x", got)
	}
	before := append([]uint8{}, pages.K...)
	asError(t, KVAppendTyped(F32, FP8E5M2, pages, k, v, []int32{0}, []int32{0}, AppendOptions{KScale: -1}), InvalidArgument, "k_scale")
	if !equalSlice(pages.K, before) {
		t.Fatal("a refused append wrote")
	}
	// RoPE at position 0 rotates by nothing, but pairs each element with its
	// partner: finite values only (a NaN or infinity would reach the partner).
	finite, codes := make([]float32, fpToken), append([]uint8{}, fp8E4M3Codes...)
	for i, x := range fp8Values {
		finite[i] = x * 0.5
		if math.IsInf(float64(x), 0) || math.IsNaN(float64(x)) {
			finite[i], codes[i] = 0.5, 0x38
		}
	}
	qOut := make([]float32, 2*fpD*fpH)
	must(t, RopeKVAppendTyped(F32, FP8E4M3, pages, qOut, 2*fpH, finite, v, []int32{1}, []int32{0}, []int32{0}, fpD, 10000, qOut,
		AppendOptions{KScale: 0.5, VScale: 4}))
	if got := tokenBytes(pages.K, 1, 0); !equalSlice(got, codes) {
		t.Fatalf("RoPE K % x, want % x", got, codes)
	}
	f32Pages := KVPages[float32]{K: make([]float32, blocks*fpBS*fpToken), V: make([]float32, blocks*fpBS*fpToken), NumKVHeads: fpH,
		HeadDim: fpD, BlockSize: fpBS, Layout: TokenMajor}
	asError(t, KVAppendTyped(F32, F32, f32Pages, k, v, []int32{0}, []int32{0}, AppendOptions{VScale: 2}), InvalidArgument, "v_scale")
	asError(t, KVAppendTyped(F32, FP8E4M3, f32Pages, k, v, []int32{0}, []int32{0}, AppendOptions{}), InvalidArgument, "pages: Go element type")
}

// fillFP8 commits steps tokens of bf16 K/V (6 x noise) for each of ids.
func fillFP8(t *testing.T, c fp8Cache, ids []uint64, steps int, seed *uint64) {
	t.Helper()
	for _, id := range ids {
		must(t, c.AddRequest(id))
	}
	for s := 0; s < steps; s++ {
		tx, err := c.Begin(ids)
		must(t, err)
		for layer := uint32(0); layer < 2; layer++ {
			must(t, WriteLayer(tx, layer, bf16Noise(seed, len(ids)*fpToken), bf16Noise(seed, len(ids)*fpToken)))
		}
		must(t, tx.Commit())
	}
}

func bf16Noise(seed *uint64, n int) []uint16 {
	out := make([]uint16, n)
	for i, x := range noise(seed, n) {
		out[i] = bf16Bits(6 * x)
	}
	return out
}

// denseFP8 is a layer's committed tokens of ids dequantised with the layer's
// scales: k, v [batch, heads, max_len, dim] f32, and the lengths.
func denseFP8(t *testing.T, c fp8Cache, layer int, ids []uint64) (k, v []float32, lens []int32) {
	t.Helper()
	tables, lens, stride, err := c.Export(ids, 0)
	must(t, err)
	ks, vs, err := c.KVScales()
	must(t, err)
	maxLen := 0
	for _, n := range lens {
		if int(n) > maxLen {
			maxLen = int(n)
		}
	}
	k, v = make([]float32, len(ids)*fpToken*maxLen), make([]float32, len(ids)*fpToken*maxLen)
	for b, n := range lens {
		for tok := 0; tok < int(n); tok++ {
			block := tables[b*int(stride)+tok/fpBS]
			kt := tokenBytes(c.layer(c.k, layer), block, int32(tok%fpBS))
			vt := tokenBytes(c.layer(c.v, layer), block, int32(tok%fpBS))
			for h := 0; h < fpH; h++ {
				for d := 0; d < fpD; d++ {
					at := ((b*fpH+h)*maxLen+tok)*fpD + d
					k[at] = FP8ToFloat32(c.cfg.DType, kt[h*fpD+d]) * ks[layer]
					v[at] = FP8ToFloat32(c.cfg.DType, vt[h*fpD+d]) * vs[layer]
				}
			}
		}
	}
	return k, v, lens
}

// worstRowError is the worst over rows of max |got - want| / max |want|.
func worstRowError(got, want []float32) float64 {
	worst := 0.0
	for r := 0; r < len(want); r += fpD {
		den, num := 0.0, 0.0
		for i := r; i < r+fpD; i++ {
			den = math.Max(den, math.Abs(float64(want[i])))
			num = math.Max(num, math.Abs(float64(got[i]-want[i])))
		}
		worst = math.Max(worst, num/den)
	}
	return worst
}

func TestDecodeOverAnFP8Cache(t *testing.T) {
	const hq = 4
	for _, dtype := range []DType{FP8E4M3, FP8E5M2} {
		c := newFP8Cache(t, dtype, BF16, []float32{0.5, 2}, []float32{1.5, 0.25})
		ids := []uint64{1, 2, 3}
		seed := uint64(21)
		fillFP8(t, c, ids, 9, &seed)
		q := bf16Noise(&seed, len(ids)*hq*fpD) // about 3 N(0,1) in spread
		q32 := make([]float32, len(q))
		for i, b := range q {
			q32[i] = bf16Value(b)
		}
		tables, lens, _, err := c.Export(ids, 0)
		must(t, err)
		ks, vs, err := c.KVScales()
		must(t, err)
		for layer := 0; layer < 2; layer++ {
			k, v, refLens := denseFP8(t, c, layer, ids)
			want := make([]float32, len(q))
			must(t, ReferenceAttention(F32, q32, hq, k, v, fpH, fpD, refLens, want, ReferenceOptions{}))
			out := make([]uint16, len(q)) // DecodeLayer: q and out in the input type (bf16), the layer's scales
			must(t, DecodeLayer(c.Cache, uint32(layer), q, hq, tables, lens, out, DecodeOptions{CPUThreads: 1}))
			got := make([]float32, len(q))
			for i, b := range out {
				got[i] = bf16Value(b)
			}
			if e := worstRowError(got, want); e > 5e-3 {
				t.Fatalf("dtype %d layer %d: bf16 out worst row error %.3g", dtype, layer, e)
			}
			// By hand over the storage's bytes: bf16 q, f32 out, the scales as options, and through a plan.
			kb, vb := append([]uint8{}, c.layer(c.k, layer)...), append([]uint8{}, c.layer(c.v, layer)...)
			dt := DecodeDTypes{Q: BF16, KV: dtype, Out: F32}
			opt := DecodeOptions{CPUThreads: 1, KScale: ks[layer], VScale: vs[layer]}
			must(t, DecodeTyped(dt, q, hq, kb, vb, fpH, fpD, fpBS, TokenMajor, tables, lens, got, opt))
			if e := worstRowError(got, want); e > 5e-3 {
				t.Fatalf("dtype %d layer %d: f32 out worst row error %.3g", dtype, layer, e)
			}
			plan, err := NewDecodePlan(DecodeShape{DTypes: dt, Batch: 3, NumQHeads: hq, NumKVHeads: fpH, HeadDim: fpD, BlockSize: fpBS,
				NumBlocks: c.cfg.MaxBlocks, MaxBlocksPerSeq: uint32(len(tables) / 3), Layout: TokenMajor}, lens, DecodeOptions{CPUThreads: 1})
			must(t, err)
			planned := make([]float32, len(q))
			must(t, RunDecodePlanScaled(plan, ks[layer], vs[layer], q, kb, vb, tables, lens, planned))
			plan.Close()
			sameBits(t, "planned", planned, got)
			opt.KScale = float32(math.Inf(1))
			asError(t, DecodeTyped(dt, q, hq, kb, vb, fpH, fpD, fpBS, TokenMajor, tables, lens, got, opt), InvalidArgument, "k_scale")
		}
	}
}

func TestEngineStepOverAnFP8Cache(t *testing.T) {
	engineCache := newFP8Cache(t, FP8E4M3, BF16, []float32{0.5, 2}, []float32{1.5, 0.25})
	twin := newFP8Cache(t, FP8E4M3, BF16, []float32{0.5, 2}, []float32{1.5, 0.25})
	e := mtEngine(t, engineCache.Cache) // requests 1 and 2, rotary_dim 8
	must(t, twin.AddRequest(1))
	must(t, twin.AddRequest(2))
	ids := []uint64{1, 2}
	seed := uint64(9)
	for step := 0; step < 2; step++ {
		if step == 1 { // a scale change between steps applies to the next
			must(t, engineCache.SetKVScales([]float32{1, 0.125}, []float32{3, 1}))
			must(t, twin.SetKVScales([]float32{1, 0.125}, []float32{3, 1}))
		}
		type layerIn struct{ q, k, v []uint16 }
		in := []layerIn{}
		for layer := 0; layer < 2; layer++ {
			in = append(in, layerIn{bf16Noise(&seed, 2*engineQHeads*fpD), bf16Noise(&seed, 2*fpToken), bf16Noise(&seed, 2*fpToken)})
		}
		st, err := e.BeginStep(ids)
		must(t, err)
		got := make([][]uint16, 2)
		for layer, x := range in {
			got[layer] = make([]uint16, len(x.q))
			must(t, StepLayer(st, uint32(layer), x.q, x.k, x.v, got[layer]))
		}
		must(t, st.Commit())
		tx, err := twin.Begin(ids)
		must(t, err)
		for layer, x := range in {
			qRot := make([]uint16, len(x.q))
			must(t, WriteLayerRope(tx, uint32(layer), x.q, engineQHeads, x.k, x.v, fpD, 10000, qRot))
			tables, _, err := tx.BlockTables(0)
			must(t, err)
			rows, err := tx.Rows()
			must(t, err)
			want := make([]uint16, len(x.q))
			must(t, DecodeLayer(twin.Cache, uint32(layer), qRot, engineQHeads, tables, rows.EffectiveSeqLens, want, DecodeOptions{CPUThreads: 1}))
			if !equalSlice(got[layer], want) {
				t.Fatalf("step %d layer %d: engine output differs from the step by hand", step, layer)
			}
		}
		must(t, tx.Commit())
		if !equalSlice(engineCache.k, twin.k) || !equalSlice(engineCache.v, twin.v) {
			t.Fatalf("step %d: stored bytes differ", step)
		}
	}
}
