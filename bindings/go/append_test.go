package flashdec

import (
	"errors"
	"strings"
	"testing"
	"unsafe"
)

const (
	apH, apD, apBS, apNB = 2, 8, 4, 5
	apBlock              = apH * apD * apBS
	apTok                = apH * apD
)

// tokenAt is the [H*D] K or V of (block, offset) in token-major pages.
func tokenAt(pages []float32, block, offset int) []float32 {
	out := make([]float32, 0, apTok)
	for h := 0; h < apH; h++ {
		start := ((block*apH+h)*apBS + offset) * apD
		out = append(out, pages[start:start+apD]...)
	}
	return out
}

func equalSlice[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func allEqual(x []float32, v float32) bool {
	for _, e := range x {
		if e != v {
			return false
		}
	}
	return true
}

func newPages() KVPages[float32] {
	return KVPages[float32]{K: make([]float32, apNB*apBlock), V: make([]float32, apNB*apBlock),
		NumKVHeads: apH, HeadDim: apD, BlockSize: apBS, Layout: TokenMajor}
}

func expectInvalid(t *testing.T, err error, substring string) {
	t.Helper()
	var fe *Error
	if !errors.As(err, &fe) || fe.Status != InvalidArgument || !strings.Contains(fe.Message, substring) {
		t.Fatalf("want InvalidArgument containing %q, got %v", substring, err)
	}
}

func TestKVAppendWritesExactlyTheSlots(t *testing.T) {
	pages := newPages()
	seed := uint64(3)
	k, v := noise(&seed, 3*apTok), noise(&seed, 3*apTok)
	ids, offs := []int32{4, 0, 4}, []int32{3, 1, 0}
	if err := KVAppend(F32, pages, k, v, ids, offs); err != nil {
		t.Fatal(err)
	}
	nonzero := 0
	for i := range ids {
		if !equalSlice(tokenAt(pages.K, int(ids[i]), int(offs[i])), k[i*apTok:(i+1)*apTok]) ||
			!equalSlice(tokenAt(pages.V, int(ids[i]), int(offs[i])), v[i*apTok:(i+1)*apTok]) {
			t.Fatalf("token %d not at block %d offset %d", i, ids[i], offs[i])
		}
	}
	for _, x := range pages.K {
		if x != 0 {
			nonzero++
		}
	}
	if nonzero != 3*apTok {
		t.Fatalf("%d elements written, want %d", nonzero, 3*apTok)
	}
}

func TestRopeKVAppendMatchesRopeApply(t *testing.T) {
	pages := newPages()
	seed := uint64(4)
	q, k, v := noise(&seed, 2*2*apTok), noise(&seed, 2*apTok), noise(&seed, 2*apTok)
	positions := []int32{7, 0}
	qOut := make([]float32, len(q))
	if err := RopeKVAppend(F32, pages, q, 2*apH, k, v, []int32{1, 2}, []int32{0, 3}, positions, apD, 500, qOut); err != nil {
		t.Fatal(err)
	}
	qRef := append([]float32(nil), q...)
	kRef := append([]float32(nil), k...)
	if err := RopeApply(F32, qRef, 2*apH, apD, positions, apD, 500); err != nil {
		t.Fatal(err)
	}
	if err := RopeApply(F32, kRef, apH, apD, positions, apD, 500); err != nil {
		t.Fatal(err)
	}
	if !equalSlice(qOut, qRef) || !equalSlice(tokenAt(pages.K, 1, 0), kRef[:apTok]) || !equalSlice(tokenAt(pages.K, 2, 3), kRef[apTok:]) {
		t.Fatal("rotated q or k differ from RopeApply")
	}
	if !equalSlice(tokenAt(pages.V, 2, 3), v[apTok:]) {
		t.Fatal("v must be stored raw")
	}
	// In place: qOut may be q.
	if err := RopeKVAppend(F32, pages, q, 2*apH, k, v, []int32{1, 2}, []int32{0, 3}, positions, apD, 500, q); err != nil {
		t.Fatal(err)
	}
	if !equalSlice(q, qRef) {
		t.Fatal("in-place rotation differs")
	}
}

func TestAppendFailuresWriteNothing(t *testing.T) {
	pages := newPages()
	seed := uint64(5)
	k, v, q := noise(&seed, 2*apTok), noise(&seed, 2*apTok), noise(&seed, 2*apTok)
	qOut := make([]float32, len(q))
	for i := range qOut {
		qOut[i] = 7
	}
	expectInvalid(t, KVAppend(F32, pages, k, v, []int32{0, apNB}, []int32{0, 0}), "block_ids[1] = 5 is out of range")
	expectInvalid(t, KVAppend(F32, pages, k, v, []int32{0, 1}, []int32{0, apBS}), "offsets[1] = 4 is out of range")
	expectInvalid(t, RopeKVAppend(F32, pages, q, apH, k, v, []int32{0, 1}, []int32{0, 0}, []int32{3, -2}, apD, 1e4, qOut),
		"positions[1] = -2 must be >= 0")
	expectInvalid(t, RopeKVAppend(F32, pages, q, apH, k, v, []int32{0, 1}, []int32{0, 0}, []int32{3, 2}, 3, 1e4, qOut), "rotary_dim")
	expectInvalid(t, RopeKVAppend(F32, pages, q, apH, k, v, []int32{0, 1}, []int32{0, 0}, []int32{3, 2}, apD, 1e4, k),
		"q_out must not overlap k or v")
	// binding checks
	expectInvalid(t, KVAppend(F32, pages, k, v, []int32{0}, []int32{0, 1}), "offsets: expected 1 entries")
	expectInvalid(t, KVAppend(F16, KVPages[uint16]{K: make([]uint16, apBlock), V: make([]uint16, apBlock), NumKVHeads: apH, HeadDim: apD, BlockSize: apBS},
		make([]uint16, apTok), make([]uint16, apTok+1), []int32{0}, []int32{0}), "k/v: expected 16 elements")
	short := KVPages[float32]{K: pages.K[:apBlock+1], V: pages.V[:apBlock+1], NumKVHeads: apH, HeadDim: apD, BlockSize: apBS}
	expectInvalid(t, KVAppend(F32, short, k, v, []int32{0, 1}, []int32{0, 1}), "pages.K")
	expectInvalid(t, KVAppend(BF16, pages, k, v, []int32{0, 1}, []int32{0, 1}), "Go element type does not match")
	if !allEqual(pages.K, 0) || !allEqual(pages.V, 0) || !allEqual(qOut, 7) {
		t.Fatal("a failing call wrote")
	}
}

func TestExternalStorageAndAsyncError(t *testing.T) {
	// External storage must be C memory: the cache keeps the pointers.
	var arena cArena
	defer arena.free()
	cfg := small(2)
	elems := int(cfg.NumLayers*cfg.MaxBlocks) * apBlock
	cfg.KStorage = arena.alloc(elems * 4)
	cfg.VStorage = arena.alloc(elems * 4)
	ks := unsafe.Slice((*float32)(cfg.KStorage), elems)
	c, err := NewCache(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.Config().KStorage != cfg.KStorage || c.Config().VStorage != cfg.VStorage {
		t.Fatal("Config does not report the external storage")
	}
	if err := c.AsyncError(); err != nil {
		t.Fatalf("CPU cache AsyncError: %v", err)
	}
	if err := c.AddRequest(1); err != nil {
		t.Fatal(err)
	}
	seed := uint64(6)
	k := noise(&seed, apTok)
	tx, err := c.Begin([]uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := tx.Rows()
	for layer := uint32(0); layer < 2; layer++ {
		if err := WriteLayer(tx, layer, k, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	layer1 := ks[int(cfg.MaxBlocks)*apBlock:]
	if !equalSlice(tokenAt(layer1, int(rows.BlockIDs[0]), int(rows.Offsets[0])), k) {
		t.Fatal("token not in the caller's storage")
	}
	if err := c.AsyncError(); err == nil || err.(*Error).Status != InvalidState {
		t.Fatalf("AsyncError on a closed cache: %v", err)
	}

	oneSided := small(1)
	oneSided.KStorage = cfg.KStorage
	_, err = NewCache(oneSided)
	expectInvalid(t, err, "config.k_storage and config.v_storage must both be set")
	strided := small(1)
	strided.StrideBlock = 64
	_, err = NewCache(strided)
	expectInvalid(t, err, "strides need external storage")
}

func TestExportAsyncOnCPUMatchesExport(t *testing.T) {
	c, err := NewCache(small(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, id := range []uint64{1, 2} {
		if err := c.AddRequest(id); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(7)
	for i := 0; i < 5; i++ {
		if err := Append(c, []uint64{1, 2}, noise(&seed, 2*apTok), noise(&seed, 2*apTok)); err != nil {
			t.Fatal(err)
		}
	}
	ids := []uint64{2, 1}
	want, wantLens, _, err := c.Export(ids, 3)
	if err != nil {
		t.Fatal(err)
	}
	tables, lens := []int32{9, 9, 9, 9, 9, 9}, []int32{9, 9}
	if err := c.ExportAsync(ids, 3, unsafe.Pointer(&tables[0]), unsafe.Pointer(&lens[0]), nil); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if tables[i] != want[i] {
			t.Fatalf("tables %v, want %v", tables, want)
		}
	}
	if lens[0] != wantLens[0] || lens[1] != wantLens[1] {
		t.Fatalf("lens %v, want %v", lens, wantLens)
	}
	narrow, narrowLens := []int32{9, 9}, []int32{9, 9}
	expectInvalid(t, c.ExportAsync(ids, 1, unsafe.Pointer(&narrow[0]), unsafe.Pointer(&narrowLens[0]), nil), "more than table_stride 1")
	err = c.ExportAsync([]uint64{42}, 1, nil, unsafe.Pointer(&narrowLens[0]), nil)
	if fe, ok := err.(*Error); !ok || fe.Status != NotFound {
		t.Fatalf("unknown id: %v", err)
	}
	if narrow[0] != 9 || narrow[1] != 9 || narrowLens[0] != 9 || narrowLens[1] != 9 {
		t.Fatal("a failing export wrote")
	}

	tx, err := c.Begin([]uint64{1})
	if err != nil {
		t.Fatal(err)
	}
	txTables, txLens := []int32{9, 9}, []int32{9}
	if err := tx.BlockTablesAsync(2, unsafe.Pointer(&txTables[0]), unsafe.Pointer(&txLens[0]), nil); err != nil {
		t.Fatal(err)
	}
	syncTables, _, err := tx.BlockTables(2)
	if err != nil {
		t.Fatal(err)
	}
	if txLens[0] != 6 || txTables[0] != syncTables[0] || txTables[1] != syncTables[1] {
		t.Fatalf("tx tables %v lens %v, want %v and 6", txTables, txLens, syncTables)
	}
}
