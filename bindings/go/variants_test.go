package flashdec

// Attention variants of decode (S2.3: DecodeOptions.LogitSoftcap,
// SlidingWindow, Sinks) through Decode, DecodeTyped, NewDecodePlan /
// RunDecodePlan / RunDecodePlanWith and DecodeLayer: equal to
// ReferenceAttention with the same variants; -inf sinks give the plain bits;
// NaN sinks and a wrong length are refused naming sinks.

import (
	"fmt"
	"math"
	"testing"
)

const (
	varHQ, varHKV, varD, varBS = 4, 2, 8, 4
	varMBPS                    = 6 // blocks per row in the tables
	varDense                   = varMBPS * varBS
)

var (
	varLens   = []int32{21, 9}
	varIndptr = []int32{0, 3, 5}
	varSinks  = []float32{0.5, -1, 2, 0}
)

type varProblem struct {
	k, v, dk, dv, q []float32
	tables          []int32
}

// newVarProblem: paged K/V of rows of 21 and 9 tokens (blocks in a scrambled
// order), the same K/V laid out densely ([batch, hkv, 24, d]) and q of 5
// query tokens.
func newVarProblem() varProblem {
	seed := uint64(11)
	const nb = 12
	p := varProblem{k: noise(&seed, nb*varHKV*varBS*varD)}
	p.v = noise(&seed, len(p.k))
	p.tables = []int32{7, 2, 10, 0, 5, 9, 3, 11, 1, 4, 6, 8}
	p.dk, p.dv = make([]float32, 2*varHKV*varDense*varD), make([]float32, 2*varHKV*varDense*varD)
	for r := 0; r < 2; r++ {
		for tok := 0; tok < varDense; tok++ {
			for h := 0; h < varHKV; h++ {
				src := ((int(p.tables[r*varMBPS+tok/varBS])*varHKV+h)*varBS + tok%varBS) * varD
				dst := ((r*varHKV+h)*varDense + tok) * varD
				copy(p.dk[dst:dst+varD], p.k[src:src+varD])
				copy(p.dv[dst:dst+varD], p.v[src:src+varD])
			}
		}
	}
	p.q = noise(&seed, 5*varHQ*varD)
	for i := range p.q {
		p.q[i] *= 4
	}
	return p
}

func (p varProblem) decode(t *testing.T, q []float32, opt DecodeOptions) ([]float32, error) {
	t.Helper()
	out := make([]float32, len(q))
	err := Decode(F32, q, varHQ, p.k, p.v, varHKV, varD, varBS, TokenMajor, p.tables, varLens, out, opt)
	return out, err
}

func (p varProblem) reference(t *testing.T, q []float32, opt DecodeOptions) []float32 {
	t.Helper()
	out := make([]float32, len(q))
	must(t, ReferenceAttention(F32, q, varHQ, p.dk, p.dv, varHKV, varD, varLens, out, ReferenceOptions{
		SmScale: opt.SmScale, LogitSoftcap: opt.LogitSoftcap, SlidingWindow: opt.SlidingWindow, Sinks: opt.Sinks, QIndptr: opt.QIndptr}))
	return out
}

func (p varProblem) shape() DecodeShape {
	return DecodeShape{DTypes: SameDTypes(F32), Batch: 2, NumQHeads: varHQ, NumKVHeads: varHKV, HeadDim: varD,
		BlockSize: varBS, NumBlocks: 12, MaxBlocksPerSeq: varMBPS, Layout: TokenMajor}
}

// lastTokens is each row's last query token: one token per row.
func (p varProblem) lastTokens() []float32 {
	n := varHQ * varD
	return append(append([]float32{}, p.q[2*n:3*n]...), p.q[4*n:5*n]...)
}

func closeTo(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-5*(1+math.Abs(float64(want[i]))) {
			t.Fatalf("%s: out[%d] = %v, want %v", what, i, got[i], want[i])
		}
	}
}

func varVariants() []DecodeOptions {
	return []DecodeOptions{
		{LogitSoftcap: 2},
		{SlidingWindow: 1},
		{SlidingWindow: 5},
		{SlidingWindow: 8, NumSplits: 3},
		{Sinks: varSinks},
		{LogitSoftcap: 3, SlidingWindow: 6, Sinks: varSinks, CPUThreads: 2},
	}
}

func TestDecodeVariantsMatchReference(t *testing.T) {
	p := newVarProblem()
	for _, o := range varVariants() {
		name := fmt.Sprintf("%+v", o)
		multi := o
		multi.QIndptr = varIndptr
		want := p.reference(t, p.q, multi)
		got, err := p.decode(t, p.q, multi)
		must(t, err)
		closeTo(t, "decode multi "+name, got, want)
		// Through a plan made with the variants.
		plan, err := NewDecodePlan(p.shape(), varLens, multi)
		must(t, err)
		planned := make([]float32, len(p.q))
		must(t, RunDecodePlan(plan, p.q, p.k, p.v, p.tables, varLens, planned))
		plan.Close()
		closeTo(t, "plan "+name, planned, want)
		// One query token per row.
		q1 := p.lastTokens()
		got1, err := p.decode(t, q1, o)
		must(t, err)
		closeTo(t, "decode "+name, got1, p.reference(t, q1, o))
	}
}

func TestDecodePlanRunsTakeTheirOwnVariants(t *testing.T) {
	p := newVarProblem()
	plan, err := NewDecodePlan(p.shape(), varLens, DecodeOptions{QIndptr: varIndptr, SlidingWindow: 4})
	must(t, err)
	defer plan.Close()
	out := make([]float32, len(p.q))
	must(t, RunDecodePlan(plan, p.q, p.k, p.v, p.tables, varLens, out))
	closeTo(t, "planned window", out, p.reference(t, p.q, plan.Options()))
	for _, change := range []func(*DecodeOptions){
		func(o *DecodeOptions) { o.SlidingWindow = 0 },
		func(o *DecodeOptions) { o.SlidingWindow, o.LogitSoftcap = 16, 5 },
		func(o *DecodeOptions) { o.Sinks = varSinks },
	} {
		o := plan.Options()
		change(&o)
		must(t, RunDecodePlanWith(plan, o, p.q, p.k, p.v, p.tables, varLens, out))
		closeTo(t, fmt.Sprintf("run with %+v", o), out, p.reference(t, p.q, o))
	}
	// MaxQLenHint is planned: the library refuses another, naming it.
	o := plan.Options()
	o.MaxQLenHint = 3
	asError(t, RunDecodePlanWith(plan, o, p.q, p.k, p.v, p.tables, varLens, out), InvalidArgument, "max_q_len_hint")
	// The plan keeps its own copy of the sinks.
	sinks := append([]float32{}, varSinks...)
	plan2, err := NewDecodePlan(p.shape(), nil, DecodeOptions{QIndptr: varIndptr, Sinks: sinks})
	must(t, err)
	defer plan2.Close()
	sinks[0] = 100
	must(t, RunDecodePlan(plan2, p.q, p.k, p.v, p.tables, varLens, out))
	closeTo(t, "plan sinks", out, p.reference(t, p.q, DecodeOptions{QIndptr: varIndptr, Sinks: varSinks}))
}

func TestDecodeVariantsBF16(t *testing.T) {
	p := newVarProblem()
	round := func(x []float32) []uint16 {
		out := make([]uint16, len(x))
		for i, a := range x {
			out[i] = bf16Bits(a)
		}
		return out
	}
	back := func(x []uint16) []float32 {
		out := make([]float32, len(x))
		for i, b := range x {
			out[i] = bf16Value(b)
		}
		return out
	}
	o := DecodeOptions{QIndptr: varIndptr, LogitSoftcap: 3, SlidingWindow: 6, Sinks: varSinks}
	q, k, v := round(p.q), round(p.k), round(p.v)
	got := make([]uint16, len(q))
	must(t, Decode(BF16, q, varHQ, k, v, varHKV, varD, varBS, TokenMajor, p.tables, varLens, got, o))
	want := make([]float32, len(q))
	must(t, ReferenceAttention(F32, back(q), varHQ, back(round(p.dk)), back(round(p.dv)), varHKV, varD, varLens, want,
		ReferenceOptions{QIndptr: varIndptr, LogitSoftcap: 3, SlidingWindow: 6, Sinks: varSinks}))
	g := back(got)
	for r := 0; r < len(want); r += varD {
		var num, den float64
		for i := r; i < r+varD; i++ {
			num += float64((g[i] - want[i]) * (g[i] - want[i]))
			den += float64(want[i] * want[i])
		}
		if e := math.Sqrt(num) / math.Max(math.Sqrt(den), 1e-30); e > 5e-3 {
			t.Fatalf("bf16 row %d error %v", r/varD, e)
		}
	}
}

func TestDecodeMinusInfSinksAndLongWindowGiveThePlainBits(t *testing.T) {
	p := newVarProblem()
	plain, err := p.decode(t, p.q, DecodeOptions{QIndptr: varIndptr})
	must(t, err)
	none := []float32{float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))}
	for _, o := range []DecodeOptions{{Sinks: none}, {SlidingWindow: 21}, {SlidingWindow: 1000}} {
		o.QIndptr = varIndptr
		got, err := p.decode(t, p.q, o)
		must(t, err)
		sameBits(t, fmt.Sprintf("%+v", o), got, plain)
	}
}

func TestDecodeBadVariantsAreRefused(t *testing.T) {
	p := newVarProblem()
	nan := float32(math.NaN())
	plan, err := NewDecodePlan(p.shape(), nil, DecodeOptions{QIndptr: varIndptr})
	must(t, err)
	defer plan.Close()
	for _, c := range []struct {
		opt     DecodeOptions
		message string
	}{
		{DecodeOptions{Sinks: []float32{0, 0, nan, 0}}, "sinks[2]"}, // the library's
		{DecodeOptions{SlidingWindow: -1}, "sliding_window"},
		{DecodeOptions{LogitSoftcap: -1}, "logit_softcap"},
		{DecodeOptions{LogitSoftcap: float32(math.Inf(1))}, "logit_softcap"},
		{DecodeOptions{Sinks: []float32{0, 0, 0}}, "sinks: expected 4 entries (num_q_heads), got 3"}, // the binding's
	} {
		c.opt.QIndptr = varIndptr
		out := make([]float32, len(p.q))
		for i := range out {
			out[i] = 7
		}
		asError(t, Decode(F32, p.q, varHQ, p.k, p.v, varHKV, varD, varBS, TokenMajor, p.tables, varLens, out, c.opt), InvalidArgument, c.message)
		for i := range out {
			if out[i] != 7 {
				t.Fatalf("%+v: out written", c.opt)
			}
		}
		asError(t, RunDecodePlanWith(plan, c.opt, p.q, p.k, p.v, p.tables, varLens, out), InvalidArgument, c.message)
	}
	_, err = NewDecodePlan(p.shape(), nil, DecodeOptions{Sinks: []float32{0}})
	expectInvalid(t, err, "sinks: expected 4 entries")
}

func TestDecodeLayerVariants(t *testing.T) {
	c := newCache(t, CacheConfig{NumLayers: 1, NumKVHeads: varHKV, HeadDim: varD, BlockSize: varBS, MaxBlocks: 8, DType: F32})
	defer c.Close()
	seed := uint64(5)
	must(t, c.AddRequest(1))
	for step := 0; step < 7; step++ {
		tx, err := c.Begin([]uint64{1})
		must(t, err)
		must(t, WriteLayer(tx, 0, noise(&seed, varHKV*varD), noise(&seed, varHKV*varD)))
		must(t, tx.Commit())
	}
	tables, lens, _, err := c.Export([]uint64{1}, 0)
	must(t, err)
	q := noise(&seed, varHQ*varD)
	plain, got := make([]float32, len(q)), make([]float32, len(q))
	must(t, DecodeLayer(c, 0, q, varHQ, tables, lens, plain, DecodeOptions{}))
	none := []float32{float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1)), float32(math.Inf(-1))}
	must(t, DecodeLayer(c, 0, q, varHQ, tables, lens, got, DecodeOptions{Sinks: none, SlidingWindow: 7}))
	sameBits(t, "layer: -inf sinks, window = seq_len", got, plain)
	// A window of 1: out = the last token's V (of the head's KV head).
	must(t, DecodeLayer(c, 0, q, varHQ, tables, lens, got, DecodeOptions{SlidingWindow: 1, LogitSoftcap: 2, Sinks: []float32{-50, -50, -50, -50}}))
	for h := 0; h < varHQ; h++ {
		for i := 0; i < varD; i++ {
			if math.Abs(float64(got[h*varD+i]-got[(h^1)*varD+i])) > 1e-6 {
				t.Fatalf("window 1: heads %d and %d of one KV head differ", h, h^1)
			}
		}
	}
	expectInvalid(t, DecodeLayer(c, 0, q, varHQ, tables, lens, got, DecodeOptions{Sinks: []float32{0}}), "sinks: expected 4 entries")
}
