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

// Multi-token queries over the K/V of newPlanProblem: two rows of 5 and 3
// tokens whose last 2 and 3 tokens are queries (2 table slots per row).
func (p planProblem) multiToken(seed uint64) planProblem {
	p.tables, p.lens = []int32{4, 1, 5, -1}, []int32{5, 3}
	p.q = noise(&seed, 5*int(p.hq*p.d))
	return p
}

var mtIndptr = []int32{0, 2, 5}

// causalReference is causal attention in float64 over the packed token-major
// K/V: query j of a row of n queries and len tokens sees positions
// 0 .. len-n+j.
func causalReference(p planProblem, indptr []int32) []float64 {
	hq, hkv, d, bs := int(p.hq), int(p.hkv), int(p.d), int(p.bs)
	slots := len(p.tables) / len(p.lens)
	at := func(r, h, t int) int { return ((int(p.tables[r*slots+t/bs])*hkv+h)*bs + t%bs) * d }
	out := make([]float64, len(p.q))
	for r := range p.lens {
		first, n, length := int(indptr[r]), int(indptr[r+1]-indptr[r]), int(p.lens[r])
		for j := 0; j < n; j++ {
			visible := length - n + j + 1
			for h := 0; h < hq; h++ {
				kh, qv := h/(hq/hkv), p.q[((first+j)*hq+h)*d:]
				s, m := make([]float64, visible), math.Inf(-1)
				for t := range s {
					for i := 0; i < d; i++ {
						s[t] += float64(qv[i]) * float64(p.k[at(r, kh, t)+i])
					}
					s[t] /= math.Sqrt(float64(d))
					m = math.Max(m, s[t])
				}
				sum := 0.0
				for t := range s {
					s[t] = math.Exp(s[t] - m)
					sum += s[t]
				}
				for i := 0; i < d; i++ {
					acc := 0.0
					for t := range s {
						acc += s[t] * float64(p.v[at(r, kh, t)+i])
					}
					out[((first+j)*hq+h)*d+i] = acc / sum
				}
			}
		}
	}
	return out
}

// Multi-token queries (QIndptr) on the CPU: causal attention within 1e-5 of a
// float64 reference, the same bits for other thread counts, a hint, and
// through a plan (which keeps its own copy of QIndptr).
func TestDecodeMultiTokenMatchesCausalReference(t *testing.T) {
	p := newPlanProblem(30).multiToken(31)
	want := causalReference(p, mtIndptr)
	out := make([]float32, len(p.q))
	must(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out, DecodeOptions{QIndptr: mtIndptr}))
	for i := range want {
		if math.Abs(float64(out[i])-want[i]) > 1e-5*(1+math.Abs(want[i])) {
			t.Fatalf("out[%d] = %v, reference %v", i, out[i], want[i])
		}
	}
	for _, opt := range []DecodeOptions{{CPUThreads: 3}, {MaxQLenHint: 3, NumSplits: 2}} {
		indptr := append([]int32{}, mtIndptr...)
		opt.QIndptr = indptr
		got := make([]float32, len(p.q))
		must(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, got, opt))
		sameBits(t, "decode", got, out)
		plan, err := NewDecodePlan(p.shape(F32), p.lens, opt)
		must(t, err)
		indptr[1] = 1 // the plan copied it
		got = make([]float32, len(p.q))
		must(t, RunDecodePlan(plan, p.q, p.k, p.v, p.tables, p.lens, got))
		sameBits(t, "plan", got, out)
		plan.Close()
	}
}

// One query token per row through QIndptr gives the bits of QIndptr nil.
func TestDecodeOneTokenRowsThroughQIndptr(t *testing.T) {
	p := newPlanProblem(32)
	p.tables, p.lens = []int32{4, 1, 0, 3, -1, -1, 5, 2, -1}, []int32{9, 1, 5}
	want := make([]float32, len(p.q))
	must(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, want, DecodeOptions{}))
	got := make([]float32, len(p.q))
	opt := DecodeOptions{QIndptr: []int32{0, 1, 2, 3}, MaxQLenHint: 1}
	must(t, Decode(F32, p.q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, got, opt))
	sameBits(t, "q_indptr", got, want)
}

// The binding checks the lengths (q_indptr, q, out) before calling C; the
// library checks the offsets (its InvalidArgument, naming the row); nothing
// is written by a refused call.
func TestDecodeMultiTokenChecks(t *testing.T) {
	p := newPlanProblem(33).multiToken(34)
	row := int(p.hq * p.d)
	out := make([]float32, len(p.q))
	for i := range out {
		out[i] = 7
	}
	decode := func(q, out []float32, opt DecodeOptions) error {
		return Decode(F32, q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, out, opt)
	}
	asError(t, decode(p.q, out, DecodeOptions{QIndptr: mtIndptr[:2]}), InvalidArgument, "q_indptr: expected 3 entries (batch + 1), got 2")
	asError(t, decode(p.q, out, DecodeOptions{QIndptr: []int32{0, 2, 4}}), InvalidArgument,
		"q/out: expected 128 elements (4 query tokens (q_indptr[2]) x 4 x 8), got 160 and 160")
	asError(t, decode(p.q, out[:4*row], DecodeOptions{QIndptr: mtIndptr}), InvalidArgument, "q/out: expected 160 elements")
	asError(t, decode(p.q, out, DecodeOptions{QIndptr: []int32{0, 2, -1}}), InvalidArgument, "q_indptr[2] = -1")
	shape := p.shape(F32)
	_, err := NewDecodePlan(shape, nil, DecodeOptions{QIndptr: []int32{0, 2, 5, 6}})
	asError(t, err, InvalidArgument, "q_indptr: expected 3 entries (batch + 1), got 4")
	plan, err := NewDecodePlan(shape, nil, DecodeOptions{QIndptr: mtIndptr})
	must(t, err)
	asError(t, RunDecodePlan(plan, p.q[:2*row], p.k, p.v, p.tables, p.lens, out[:2*row]), InvalidArgument, "q/out: expected 160 elements")
	plan.Close()

	q6, out6 := append(append([]float32{}, p.q...), p.q[:row]...), make([]float32, 6*row)
	for _, c := range []struct {
		indptr  []int32
		q, out  []float32
		hint    int32
		message string
	}{
		// Row 1 has 3 K/V tokens: 4 query tokens cannot all be among them.
		{[]int32{0, 2, 6}, q6, out6, 0, "row 1 has 4 query tokens but seq_lens[1] = 3"},
		{[]int32{1, 2, 5}, p.q, out, 0, "q_indptr[0] must be 0"},
		{[]int32{0, 0, 5}, p.q, out, 0, "q_indptr must increase"},
		{mtIndptr, p.q, out, 2, "row 1 has 3 query tokens, more than max_q_len_hint = 2"},
	} {
		opt := DecodeOptions{QIndptr: c.indptr, MaxQLenHint: c.hint}
		asError(t, decode(c.q, c.out, opt), InvalidArgument, c.message)
		plan, err := NewDecodePlan(shape, p.lens, opt)
		must(t, err)
		asError(t, RunDecodePlan(plan, c.q, p.k, p.v, p.tables, p.lens, c.out), InvalidArgument, c.message)
		plan.Close()
	}
	for i := range out {
		if out[i] != 7 {
			t.Fatal("a refused call wrote out")
		}
	}
}

// Element types are separate fields; the CPU backend serves q and out of
// any compute type over any K/V type (0.2, issue 15): bf16 q over f32 K/V
// is f32 attention of the same values. FP8 is a K/V type only.
func TestDecodeMixedDTypesOnCPU(t *testing.T) {
	p := newPlanProblem(8)
	q, q32 := make([]uint16, len(p.q)), make([]float32, len(p.q))
	for i, x := range p.q {
		q[i] = uint16(math.Float32bits(x) >> 16)
		q32[i] = math.Float32frombits(uint32(q[i]) << 16)
	}
	want, got := make([]float32, len(p.q)), make([]float32, len(p.q))
	must(t, Decode(F32, q32, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, want, DecodeOptions{}))
	mixed := DecodeDTypes{Q: BF16, KV: F32, Out: F32}
	must(t, DecodeTyped(mixed, q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, got, DecodeOptions{}))
	sameBits(t, "bf16 q over f32 K/V", got, want)
	shape := p.shape(F32)
	shape.DTypes = mixed
	plan, err := NewDecodePlan(shape, nil, DecodeOptions{})
	must(t, err)
	defer plan.Close()
	must(t, RunDecodePlan(plan, q, p.k, p.v, p.tables, p.lens, got))
	sameBits(t, "planned", got, want)
	q8 := make([]uint8, len(p.q))
	err = DecodeTyped(DecodeDTypes{Q: FP8E4M3, KV: F32, Out: F32}, q8, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens,
		got, DecodeOptions{})
	asError(t, err, InvalidArgument, "q_dtype")
	// A Go element type that cannot hold the dtype is the binding's refusal.
	err = DecodeTyped(DecodeDTypes{Q: F32, KV: F32, Out: F32}, q, p.hq, p.k, p.v, p.hkv, p.d, p.bs, TokenMajor, p.tables, p.lens, got,
		DecodeOptions{})
	asError(t, err, InvalidArgument, "q: Go element type")
}
