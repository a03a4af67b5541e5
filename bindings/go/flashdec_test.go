package flashdec

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func small(layers uint32) CacheConfig {
	c := DefaultCacheConfig()
	c.NumLayers, c.NumKVHeads, c.HeadDim, c.BlockSize, c.MaxBlocks = layers, 2, 8, 4, 8
	c.DType = F32
	return c
}

func noise(seed *uint64, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		*seed = *seed*6364136223846793005 + 1442695040888963407
		x[i] = float32(*seed>>40)/float32(1<<24) - 0.5
	}
	return x
}

func asError(t *testing.T, err error, status Status, substr string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("expected *Error with %v, got %v", status, err)
	}
	if e.Status != status || !strings.Contains(e.Message, substr) {
		t.Fatalf("expected %v containing %q, got %v: %q", status, substr, e.Status, e.Message)
	}
}

func TestVersion(t *testing.T) {
	if VersionNumber() != HeaderVersionNumber || !IsCompatible(VersionNumber()) || IsCompatible(VersionNumber()+10000) {
		t.Fatalf("version %s (%d) vs header %d", Version(), VersionNumber(), HeaderVersionNumber)
	}
	// A newer patch is compatible; a newer minor only from 1.0 on (before 1.0
	// a minor may change the ABI).
	if !IsCompatible(HeaderVersionNumber+1) || IsCompatible(HeaderVersionNumber+100) != (HeaderVersionNumber/10000 != 0) {
		t.Fatalf("IsCompatible: newer patch or minor of header %d judged wrongly", HeaderVersionNumber)
	}
	if HeaderVersionNumber%10000 >= 100 && IsCompatible(HeaderVersionNumber-100) {
		t.Fatalf("IsCompatible accepts an older minor of header %d", HeaderVersionNumber)
	}
	if n, err := CudaDeviceCount(); err != nil || n < 0 {
		t.Fatal(n, err)
	}
	if !strings.HasPrefix(NotFound.String(), "FD_ERR_NOT_FOUND") {
		t.Fatal(NotFound.String())
	}
}

func TestInvalidConfigAndClose(t *testing.T) {
	cfg := small(1)
	cfg.NumLayers = 0
	_, err := NewCache(cfg)
	asError(t, err, InvalidArgument, "num_layers")
	c, err := NewCache(small(1))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c.Close()
	asError(t, c.AddRequest(1), InvalidState, "closed")
}

func TestTransactionLifecycle(t *testing.T) {
	c, err := NewCache(small(2))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, id := range []uint64{1, 2} {
		if err := c.AddRequest(id); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(1)
	for step := 0; step < 5; step++ {
		tx, err := c.Begin([]uint64{1, 2})
		if err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			asError(t, WriteLayer(tx, 1, noise(&seed, 32), noise(&seed, 32)), InvalidArgument, "layer 0")
			if info, _ := tx.Info(); info.NextLayer != 0 {
				t.Fatal("failed write changed next_layer")
			}
		}
		for layer := uint32(0); layer < 2; layer++ {
			if err := WriteLayer(tx, layer, noise(&seed, 32), noise(&seed, 32)); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if step == 0 {
			asError(t, tx.Commit(), InvalidState, "committed")
		}
	}
	_, lens, stride, err := c.Export([]uint64{2, 1}, 0)
	if err != nil || lens[0] != 5 || lens[1] != 5 || stride != 2 {
		t.Fatal(lens, stride, err)
	}
	m, err := c.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m.U("used_blocks") != 4 || m.U("active_tokens") != 10 || m.U("transaction_failure_count") != 1 {
		t.Fatalf("metrics %+v", m)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestBindingChecksBeforeCall(t *testing.T) {
	c, _ := NewCache(small(1))
	defer c.Close()
	_ = c.AddRequest(1)
	asError(t, Append(c, []uint64{1}, make([]float32, 15), make([]float32, 16)), InvalidArgument, "k")
	asError(t, Append(c, []uint64{1}, make([]uint16, 16), make([]uint16, 16)), InvalidArgument, "element type")
	asError(t, c.AttachPrefix(1, "a\x00b"), InvalidArgument, "NUL")
	m, _ := c.Metrics()
	if m.U("allocation_count") != 0 {
		t.Fatal("a refused call allocated")
	}
	if err := Append(c, []uint64{1}, make([]float32, 16), make([]float32, 16)); err != nil {
		t.Fatal(err)
	}
}

func TestDecodeMatchesReference(t *testing.T) {
	seed := uint64(3)
	const hq, hkv, d, bs = 4, 2, 8, 4
	k, v := noise(&seed, 4*hkv*bs*d), noise(&seed, 4*hkv*bs*d)
	q := noise(&seed, 2*hq*d)
	tables, lens := []int32{2, 0, 1, 3}, []int32{6, 3}
	out := make([]float32, len(q))
	if err := Decode(F32, q, hq, k, v, hkv, d, bs, TokenMajor, tables, lens, out, DecodeOptions{CPUThreads: 1}); err != nil {
		t.Fatal(err)
	}
	dk, dv := make([]float32, 2*hkv*8*d), make([]float32, 2*hkv*8*d)
	for r := 0; r < 2; r++ {
		for j := 0; j < 2; j++ {
			b := int(tables[r*2+j])
			for h := 0; h < hkv; h++ {
				for tok := 0; tok < bs; tok++ {
					for x := 0; x < d; x++ {
						src := ((b*hkv+h)*bs+tok)*d + x
						dst := ((r*hkv+h)*8+j*bs+tok)*d + x
						dk[dst], dv[dst] = k[src], v[src]
					}
				}
			}
		}
	}
	want := make([]float32, len(q))
	if err := ReferenceAttentionDense(F32, q, hq, dk, dv, hkv, d, lens, 0, want); err != nil {
		t.Fatal(err)
	}
	for i := range out {
		if math.Abs(float64(out[i]-want[i])) > 1e-5 {
			t.Fatalf("out[%d] = %v, want %v", i, out[i], want[i])
		}
	}
	asError(t, Decode(F32, q, hq, k, v, hkv, d, bs, TokenMajor, []int32{9, 0, 1, 3}, lens, out, DecodeOptions{}), InvalidArgument, "")
}

func TestRopeRejectsOddRotaryDim(t *testing.T) {
	x := make([]float32, 16)
	for i := range x {
		x[i] = 1
	}
	asError(t, RopeApply(F32, x, 2, 8, []int32{3}, 3, 10000), InvalidArgument, "rotary_dim")
	for _, v := range x {
		if v != 1 {
			t.Fatal("failed rope wrote")
		}
	}
}

// The error message is thread-local: many goroutines failing differently at
// once must each see their own message (LockOSThread around call + read).
func TestErrorMessagesArePerThread(t *testing.T) {
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			c, err := NewCache(small(1))
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for i := 0; i < 200; i++ {
				id := uint64(1000*g + i)
				err := c.CancelRequest(id)
				var e *Error
				if !errors.As(err, &e) || !strings.Contains(e.Message, "request") {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
				runtime.Gosched()
			}
		}(g)
	}
	wg.Wait()
}

func TestFinalizerBackstop(t *testing.T) {
	for i := 0; i < 50; i++ {
		if _, err := NewCache(small(1)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.GC()
}

// Sizes whose products overflow must be refused by the binding, not wrapped:
// a wrapped block size once let a 65536-element slice pass for blocks of
// 65537 x 65536 elements, and C then read far past its end.
func TestSizeProductsDoNotWrap(t *testing.T) {
	k := make([]float32, 65536)
	v := make([]float32, 65536)
	q := make([]float32, 65537)
	out := make([]float32, 65537)
	err := Decode(F32, q, 65537, k, v, 65537, 1, 65536, TokenMajor, []int32{0}, []int32{1}, out, DecodeOptions{})
	asError(t, err, InvalidArgument, "k/v: need equal positive multiples of a block (4295032832 elements)")

	x := make([]uint16, 16)
	err = RopeApply(BF16, x, math.MaxUint32, 1<<31+1, []int32{0, 1}, 2, 10000)
	asError(t, err, InvalidArgument, "overflow")

	err = ReferenceAttentionDense(F32, make([]float32, 4), math.MaxUint32, make([]float32, 4), make([]float32, 4),
		math.MaxUint32, math.MaxUint32, []int32{1}, 0, make([]float32, 4))
	asError(t, err, InvalidArgument, "overflow")

	pages := KVPages[uint16]{K: make([]uint16, 64), V: make([]uint16, 64), NumKVHeads: math.MaxUint32, HeadDim: math.MaxUint32, BlockSize: 4}
	err = KVAppend(BF16, pages, make([]uint16, 16), make([]uint16, 16), []int32{0}, []int32{0})
	asError(t, err, InvalidArgument, "overflow")
	pages.NumKVHeads, pages.HeadDim = 2, 8
	err = RopeKVAppend(BF16, pages, make([]uint16, 16), math.MaxUint32, make([]uint16, 16), make([]uint16, 16),
		[]int32{0, 1}, []int32{0, 1}, []int32{0, 1}, 8, 10000, make([]uint16, 16))
	asError(t, err, InvalidArgument, "k/v: expected 32 elements")
	err = RopeKVAppend(BF16, pages, make([]uint16, 16), math.MaxUint32, make([]uint16, 32), make([]uint16, 32),
		[]int32{0, 1}, []int32{0, 1}, []int32{0, 1}, 8, 10000, make([]uint16, 16))
	asError(t, err, InvalidArgument, "q/q_out: expected")

	if n, ok := elemCount(math.MaxInt/2+1, 2); ok {
		t.Fatalf("elemCount(MaxInt/2+1, 2) = %d, want overflow", n)
	}
	if n, ok := elemCount(3, 0, math.MaxInt); !ok || n != 0 {
		t.Fatalf("elemCount(3, 0, MaxInt) = %d, %v; want 0, true", n, ok)
	}
	if _, ok := elemCount(2, -1); ok {
		t.Fatalf("elemCount accepted a negative size")
	}
	if fitsU32(math.MaxUint32+1) || !fitsU32(math.MaxUint32) {
		t.Fatalf("fitsU32 is wrong at the uint32 limit")
	}
}
