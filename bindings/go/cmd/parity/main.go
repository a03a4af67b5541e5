// Command parity runs the parity scenario through the Go binding; it prints
// exactly what bindings/parity/parity.c prints.
package main

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	"flashdec"
)

const (
	layers, kvHeads, qHeads, headDim, block, maxBlocks = 2, 2, 4, 8, 4, 16
	seed                                               = 20240601
)

type splitMix64 struct{ state uint64 }

func (r *splitMix64) next() uint64 {
	r.state += 0x9e3779b97f4a7c15
	z := r.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (r *splitMix64) fill(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(int32(r.next()>>40)-8388608) / 8388608.0
	}
	return out
}

func fnv1a(x []float32) uint64 {
	h := uint64(0xcbf29ce484222325)
	for _, v := range x {
		u := math.Float32bits(v)
		for b := 0; b < 4; b++ {
			h = (h ^ uint64((u>>(8*b))&0xff)) * 0x100000001b3
		}
	}
	return h
}

func ints(label string, xs []int32) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprint(x)
	}
	return " " + label + "=" + strings.Join(parts, ",")
}

func errorLine(what string, err error) string {
	var e *flashdec.Error
	if !errors.As(err, &e) {
		return "unexpected " + err.Error()
	}
	return fmt.Sprintf("error %s status=%d %s | %s", what, int32(e.Status), e.Status, e.Message)
}

func must(err error) {
	if err != nil {
		fmt.Println("FATAL", err)
		os.Exit(1)
	}
}

func main() {
	rng := &splitMix64{seed}
	fmt.Printf("version %s %d\n", flashdec.Version(), flashdec.VersionNumber())
	cfg := flashdec.DefaultCacheConfig()
	cfg.NumLayers, cfg.NumKVHeads, cfg.HeadDim, cfg.BlockSize, cfg.MaxBlocks = layers, kvHeads, headDim, block, maxBlocks
	cfg.DType = flashdec.F32
	cache, err := flashdec.NewCache(cfg)
	must(err)
	defer cache.Close()
	for _, id := range []uint64{11, 22, 33} {
		must(cache.AddRequest(id))
	}
	for step := 0; step < 6; step++ {
		ids := []uint64{11, 22, 33}
		if step%3 == 2 {
			ids = []uint64{11, 33}
		}
		n := len(ids)
		tx, err := cache.Begin(ids)
		must(err)
		rows, err := tx.Rows()
		must(err)
		fmt.Printf("step %d tx=%d rows=%d%s%s%s%s\n", step, tx.ID(), n, ints("positions", rows.Positions),
			ints("blocks", rows.BlockIDs), ints("offsets", rows.Offsets), ints("effective", rows.EffectiveSeqLens))
		for layer := uint32(0); layer < layers; layer++ {
			k := rng.fill(n * kvHeads * headDim)
			v := rng.fill(n * kvHeads * headDim)
			must(flashdec.WriteLayer(tx, layer, k, v))
		}
		must(tx.Commit())
		stride, err := cache.MaxBlocksPerSeq(ids)
		must(err)
		tables, lens, _, err := cache.Export(ids, stride)
		must(err)
		fmt.Printf("export stride=%d%s%s\n", stride, ints("lens", lens), ints("tables", tables))
		for layer := uint32(0); layer < layers; layer++ {
			q := rng.fill(n * qHeads * headDim)
			out := make([]float32, len(q))
			must(flashdec.DecodeLayer(cache, layer, q, qHeads, tables, lens, out, flashdec.DecodeOptions{CPUThreads: 1}))
			fmt.Printf("decode step=%d layer=%d hash=%016x first=%08x last=%08x\n", step, layer, fnv1a(out),
				math.Float32bits(out[0]), math.Float32bits(out[len(out)-1]))
		}
	}

	tx, err := cache.Begin([]uint64{11})
	must(err)
	k := rng.fill(kvHeads * headDim)
	v := rng.fill(kvHeads * headDim)
	if err := flashdec.WriteLayer(tx, 1, k, v); err != nil {
		fmt.Println(errorLine("write_layer", err))
	}
	must(tx.Abort())
	if err := tx.Abort(); err != nil {
		fmt.Println(errorLine("abort", err))
	}
	must(cache.AddRequest(99))
	must(cache.FinishRequest(99))
	if err := cache.AddRequest(99); err != nil {
		fmt.Println(errorLine("add_request", err))
	}
	must(cache.FinishRequest(22))
	must(cache.CancelRequest(33))
	fmt.Print("states")
	for _, id := range []uint64{11, 22, 33, 99, 44} {
		s, err := cache.RequestState(id)
		must(err)
		fmt.Printf(" %d=%d", id, s)
	}
	fmt.Println()
	m, err := cache.Metrics()
	must(err)
	for _, f := range m {
		if f.IsFloat {
			fmt.Printf("metric %s %.6f\n", f.Name, f.Float)
		} else {
			fmt.Printf("metric %s %d\n", f.Name, f.Uint)
		}
	}
	if err := cache.Validate(); err != nil {
		var e *flashdec.Error
		errors.As(err, &e)
		fmt.Printf("validate %s\n", e.Message)
	} else {
		fmt.Println("validate ok")
	}
	cache.Close()
	fmt.Println("done")
}
