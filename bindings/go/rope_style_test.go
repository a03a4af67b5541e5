package flashdec

// RoPE conventions (fd_rope_style, S3.1): RopeStyle, RopeApplyStyle,
// CacheConfig.RopeStyle and AppendOptions.RopeStyle, on the CPU.

import (
	"math"
	"testing"
	"unsafe"
)

// interleavedRef is the interleaved form in float64 of x ([tokens, heads,
// dim]): pair i is (2i, 2i + 1) at angle p * base^(-2i / rotaryDim); dims
// from rotaryDim on unchanged.
func interleavedRef(x []float32, heads, dim int, positions []int32, rotaryDim int, base float64) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	for t, p := range positions {
		for h := 0; h < heads; h++ {
			row := (t*heads + h) * dim
			for i := 0; i < rotaryDim/2; i++ {
				s, c := math.Sincos(float64(p) * math.Pow(base, -2*float64(i)/float64(rotaryDim)))
				a, b := float64(x[row+2*i]), float64(x[row+2*i+1])
				y[row+2*i], y[row+2*i+1] = a*c-b*s, b*c+a*s
			}
		}
	}
	return y
}

func rotated(t *testing.T, x []float32, heads uint32, positions []int32, rotaryDim uint32, base float32, style RopeStyle) []float32 {
	t.Helper()
	y := append([]float32(nil), x...)
	must(t, RopeApplyStyle(F32, y, heads, apD, positions, rotaryDim, base, style))
	return y
}

func TestRopeStyleValuesAndDefaults(t *testing.T) {
	if RopeSplitHalf != 0 || RopeInterleaved != 1 {
		t.Fatal("RopeStyle values differ from the header's")
	}
	if DefaultCacheConfig().RopeStyle != RopeSplitHalf || (AppendOptions{}).RopeStyle != RopeSplitHalf {
		t.Fatal("the default style is not split-half")
	}
	c := newCache(t, small(1))
	defer c.Close()
	if c.Config().RopeStyle != RopeSplitHalf {
		t.Fatalf("cache reports style %d", c.Config().RopeStyle)
	}
}

func TestRopeInterleavedMatchesTheFormula(t *testing.T) {
	seed := uint64(31)
	positions := []int32{0, 1, 9}
	x := noise(&seed, len(positions)*apTok)
	for _, r := range []uint32{apD, 6} {
		y := rotated(t, x, apH, positions, r, 100, RopeInterleaved)
		want := interleavedRef(x, apH, apD, positions, int(r), 100)
		for i := range y {
			if math.Abs(float64(y[i])-want[i]) > 1e-5*math.Abs(want[i])+1e-6 {
				t.Fatalf("rotary_dim %d, element %d: %v, want %v", r, i, y[i], want[i])
			}
			if i%apD >= int(r) && y[i] != x[i] {
				t.Fatalf("rotary_dim %d: element %d of the tail changed", r, i)
			}
		}
		split := append([]float32(nil), x...)
		must(t, RopeApply(F32, split, apH, apD, positions, r, 100))
		if equalSlice(split, y) {
			t.Fatal("interleaved equals split-half")
		}
	}
}

func TestRopeSplitHalfDefaultUnchanged(t *testing.T) {
	seed := uint64(32)
	x := noise(&seed, 2*apTok)
	a := append([]float32(nil), x...)
	must(t, RopeApply(F32, a, apH, apD, []int32{3, 11}, 6, 10000))
	var style RopeStyle // zero value
	if b := rotated(t, x, apH, []int32{3, 11}, 6, 10000, style); !equalSlice(a, b) || equalSlice(a, x) {
		t.Fatal("RopeApplyStyle(RopeSplitHalf) differs from RopeApply")
	}
}

func TestInterleavedCacheStoresKRotatedInterleaved(t *testing.T) {
	arena := &cArena{}
	defer arena.free()
	cfg := small(2)
	cfg.RopeStyle = RopeInterleaved
	n := int(cfg.NumLayers*cfg.MaxBlocks*cfg.BlockSize) * apTok // f32 elements, token-major
	cfg.KStorage, cfg.VStorage = arena.alloc(4*n), arena.alloc(4*n)
	ks, vs := unsafe.Slice((*float32)(cfg.KStorage), n), unsafe.Slice((*float32)(cfg.VStorage), n)
	c := newCache(t, cfg)
	defer c.Close()
	if c.Config().RopeStyle != RopeInterleaved {
		t.Fatalf("cache reports style %d", c.Config().RopeStyle)
	}
	layer1 := n / 2
	must(t, c.AddRequest(1))
	seed := uint64(33)
	for step := int32(0); step < 3; step++ {
		q, k, v := noise(&seed, 2*apTok), noise(&seed, apTok), noise(&seed, apTok)
		qOut := make([]float32, len(q))
		tx, err := c.Begin([]uint64{1})
		must(t, err)
		rows, err := tx.Rows()
		must(t, err)
		pos, blk, off := rows.Positions[0], int(rows.BlockIDs[0]), int(rows.Offsets[0])
		if pos != step {
			t.Fatalf("position %d, want %d", pos, step)
		}
		must(t, WriteLayer(tx, 0, k, v))
		must(t, WriteLayerRope(tx, 1, q, 2*apH, k, v, 6, 500, qOut))
		must(t, tx.Commit())
		if !equalSlice(qOut, rotated(t, q, 2*apH, []int32{pos}, 6, 500, RopeInterleaved)) {
			t.Fatalf("step %d: rotated q differs from RopeApplyStyle", step)
		}
		kRef := rotated(t, k, apH, []int32{pos}, 6, 500, RopeInterleaved)
		var storedK, storedV []float32
		for h := 0; h < apH; h++ {
			at := layer1 + ((blk*apH+h)*apBS+off)*apD
			storedK, storedV = append(storedK, ks[at:at+apD]...), append(storedV, vs[at:at+apD]...)
		}
		if !equalSlice(storedK, kRef) || !equalSlice(storedV, v) {
			t.Fatalf("step %d: stored K is not K rotated interleaved (or V not raw)", step)
		}
		if split := rotated(t, k, apH, []int32{pos}, 6, 500, RopeSplitHalf); pos > 0 && equalSlice(storedK, split) {
			t.Fatal("stored K equals the split-half rotation")
		}
	}
}

func TestRopeKVAppendStyle(t *testing.T) {
	seed := uint64(34)
	q, k, v := noise(&seed, 2*2*apTok), noise(&seed, 2*apTok), noise(&seed, 2*apTok)
	positions := []int32{7, 2}
	for _, style := range []RopeStyle{RopeSplitHalf, RopeInterleaved} {
		pages := newPages()
		qOut := make([]float32, len(q))
		must(t, RopeKVAppendTyped(F32, F32, pages, q, 2*apH, k, v, []int32{1, 2}, []int32{0, 3}, positions, 6, 500, qOut,
			AppendOptions{RopeStyle: style}))
		kRef := rotated(t, k, apH, positions, 6, 500, style)
		if !equalSlice(qOut, rotated(t, q, 2*apH, positions, 6, 500, style)) ||
			!equalSlice(tokenAt(pages.K, 1, 0), kRef[:apTok]) || !equalSlice(tokenAt(pages.K, 2, 3), kRef[apTok:]) ||
			!equalSlice(tokenAt(pages.V, 2, 3), v[apTok:]) {
			t.Fatalf("style %d: rotated q or stored k/v differ from RopeApplyStyle", style)
		}
		if style == RopeSplitHalf { // RopeKVAppend, without options, is split-half
			plain, q2 := newPages(), make([]float32, len(q))
			must(t, RopeKVAppend(F32, plain, q, 2*apH, k, v, []int32{1, 2}, []int32{0, 3}, positions, 6, 500, q2))
			if !equalSlice(q2, qOut) || !equalSlice(plain.K, pages.K) {
				t.Fatal("RopeKVAppend differs from RopeSplitHalf")
			}
		}
	}
}

func TestUnknownRopeStyleIsRefused(t *testing.T) {
	x := make([]float32, apTok)
	for i := range x {
		x[i] = 1
	}
	expectInvalid(t, RopeApplyStyle(F32, x, apH, apD, []int32{3}, apD, 10000, RopeStyle(2)), "rope_style 2 is not an fd_rope_style")
	expectInvalid(t, RopeApplyStyle(F32, x, apH, apD, []int32{3}, apD, 10000, RopeStyle(-1)), "rope_style -1 is not an fd_rope_style")
	if !allEqual(x, 1) {
		t.Fatal("a refused call wrote x")
	}

	pages := newPages()
	q, k, v := make([]float32, apTok), make([]float32, apTok), make([]float32, apTok)
	for i := range k {
		q[i], k[i], v[i] = 1, 1, 1
	}
	qOut := make([]float32, apTok)
	for i := range qOut {
		qOut[i] = 7
	}
	expectInvalid(t, RopeKVAppendTyped(F32, F32, pages, q, apH, k, v, []int32{0}, []int32{0}, []int32{1}, apD, 1e4, qOut,
		AppendOptions{RopeStyle: 5}), "params->rope_style 5")
	if !allEqual(pages.K, 0) || !allEqual(pages.V, 0) || !allEqual(qOut, 7) {
		t.Fatal("a refused append wrote something")
	}

	cfg := small(1)
	cfg.RopeStyle = 3
	_, err := NewCache(cfg)
	expectInvalid(t, err, "config.rope_style 3")
}
