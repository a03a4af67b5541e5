package flashdec

import (
	"math"
	"testing"
)

// A ragged batch over packed host K/V: 6 blocks of 4 tokens, rows of 9, 0
// and 5 tokens (the empty row gives zeros).
type planProblem struct {
	hq, hkv, d, bs uint32
	k, v, q        []float32
	tables, lens   []int32
}

func newPlanProblem(seed uint64) planProblem {
	const hq, hkv, d, bs, blocks = 4, 2, 8, 4, 6
	p := planProblem{hq: hq, hkv: hkv, d: d, bs: bs}
	p.k, p.v = noise(&seed, blocks*hkv*bs*d), noise(&seed, blocks*hkv*bs*d)
	p.q = noise(&seed, 3*hq*d)
	p.tables = []int32{4, 1, 0, -1, -1, -1, 5, 2, -1}
	p.lens = []int32{9, 0, 5}
	return p
}

func (p planProblem) shape(dt DType) DecodeShape {
	return DecodeShape{DTypes: SameDTypes(dt), Batch: uint32(len(p.lens)), NumQHeads: p.hq, NumKVHeads: p.hkv, HeadDim: p.d,
		BlockSize: p.bs, NumBlocks: uint32(len(p.k)) / (p.hkv * p.bs * p.d), MaxBlocksPerSeq: uint32(len(p.tables) / len(p.lens)),
		Layout: TokenMajor}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: out[%d] = %v, fd_decode gave %v", what, i, got[i], want[i])
		}
	}
}

// Plan + run gives fd_decode's bits, with and without host lengths, for
// several "layers" (K/V sets) of one plan; f16 as well as f32.
func TestDecodePlanRunEqualsDecode(t *testing.T) {
	p := newPlanProblem(11)
	opt := DecodeOptions{CPUThreads: 2, NumSplits: 2}
	for _, host := range [][]int32{nil, p.lens} {
		plan, err := NewDecodePlan(p.shape(F32), host, opt)
		must(t, err)
		if _, err := plan.WorkspaceSize(); err != nil {
			t.Fatal(err)
		}
		for layer := uint64(0); layer < 2; layer++ {
			l := newPlanProblem(20 + layer)
			want := make([]float32, len(l.q))
			must(t, Decode(F32, l.q, l.hq, l.k, l.v, l.hkv, l.d, l.bs, TokenMajor, l.tables, l.lens, want, opt))
			got := make([]float32, len(l.q))
			must(t, RunDecodePlan(plan, l.q, l.k, l.v, l.tables, l.lens, got))
			sameBits(t, "f32", got, want)
		}
		plan.Close()
		plan.Close() // idempotent
	}

	half := func(x []float32) []uint16 {
		h := make([]uint16, len(x))
		for i, f := range x { // f16 bits of values in [-0.5, 0.5): exact enough for a bit comparison
			h[i] = f32ToF16(f)
		}
		return h
	}
	q, k, v := half(p.q), half(p.k), half(p.v)
	want := make([]uint16, len(q))
	must(t, Decode(F16, q, p.hq, k, v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, want, DecodeOptions{}))
	plan, err := NewDecodePlan(p.shape(F16), p.lens, DecodeOptions{})
	must(t, err)
	defer plan.Close()
	got := make([]uint16, len(q))
	must(t, RunDecodePlan(plan, q, k, v, p.tables, p.lens, got))
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("f16: out[%d] = %#x, fd_decode gave %#x", i, got[i], want[i])
		}
	}
}

// f32ToF16 rounds to the nearest f16 (normal range only, which noise stays in).
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	if exp <= 0 {
		return sign
	}
	h := uint32(exp)<<10 | mant>>13
	if mant&0x1fff > 0x1000 || (mant&0x1fff == 0x1000 && h&1 == 1) {
		h++
	}
	return sign | uint16(h)
}

// A run that differs from the plan in a planned field is refused, naming the
// field, and writes nothing; so is a run with a closed plan.
func TestDecodePlanRefusesFieldMismatch(t *testing.T) {
	p := newPlanProblem(5)
	plan, err := NewDecodePlan(p.shape(F32), p.lens, DecodeOptions{})
	must(t, err)
	out := make([]float32, len(p.q))
	for i := range out {
		out[i] = 7
	}
	// Two rows instead of three.
	asError(t, RunDecodePlan(plan, p.q[:2*p.hq*p.d], p.k, p.v, p.tables[:6], p.lens[:2], out[:2*p.hq*p.d]), InvalidArgument, "batch")
	for _, x := range out {
		if x != 7 {
			t.Fatal("a refused run wrote out")
		}
	}
	asError(t, RunDecodePlan(plan, make([]uint16, len(p.q)), p.k, p.v, p.tables, p.lens, out), InvalidArgument, "q:")
	plan.Close()
	asError(t, RunDecodePlan(plan, p.q, p.k, p.v, p.tables, p.lens, out), InvalidState, "closed")
	if _, err := plan.WorkspaceSize(); err == nil {
		t.Fatal("WorkspaceSize of a closed plan succeeded")
	}
}

// q_indptr is for multi-token queries: 0.2 serves only nil.
func TestDecodeQIndptrUnsupported(t *testing.T) {
	p := newPlanProblem(6)
	out := make([]float32, len(p.q))
	opt := DecodeOptions{QIndptr: []int32{0, 1, 2, 3}}
	asError(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out, opt), Unsupported, "q_indptr")
	_, err := NewDecodePlan(p.shape(F32), nil, opt)
	asError(t, err, Unsupported, "q_indptr")
	asError(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out,
		DecodeOptions{QIndptr: []int32{0, 1}}), InvalidArgument, "batch + 1")
	asError(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out,
		DecodeOptions{MaxQLenHint: 2}), Unsupported, "max_q_len_hint")
}

// Element types are separate fields; q bf16 with K/V f16 is not served.
func TestDecodeMixedDTypesUnsupported(t *testing.T) {
	p := newPlanProblem(8)
	q, kv, out := make([]uint16, len(p.q)), make([]uint16, len(p.k)), make([]uint16, len(p.q))
	mixed := DecodeDTypes{Q: BF16, KV: F16, Out: BF16}
	err := DecodeTyped(mixed, q, p.hq, kv, kv, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out, DecodeOptions{})
	asError(t, err, Unsupported, "kv_dtype")
	shape := p.shape(F16)
	shape.DTypes = mixed
	_, err = NewDecodePlan(shape, nil, DecodeOptions{})
	asError(t, err, Unsupported, "kv_dtype")
	// A Go element type that cannot hold the dtype is the binding's refusal.
	err = DecodeTyped(DecodeDTypes{Q: F32, KV: F16, Out: F16}, q, p.hq, kv, kv, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out,
		DecodeOptions{})
	asError(t, err, InvalidArgument, "q: Go element type")
}
