// Command decode_loop is a short decode loop with the Go binding: a two-layer
// float32 cache, three requests, and per step one transaction (RoPE + append
// per layer, paged decode over the transaction's rows, commit).
package main

import (
	"fmt"
	"log"
	"math"
	"math/rand"

	"flashdec"
)

const (
	layers, kvHeads, qHeads, headDim = 2, 2, 4, 64
)

func noise(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func main() {
	fmt.Println("libflashdec", flashdec.Version())
	cfg := flashdec.DefaultCacheConfig()
	cfg.NumLayers, cfg.NumKVHeads, cfg.HeadDim, cfg.BlockSize, cfg.MaxBlocks = layers, kvHeads, headDim, 16, 64
	cfg.DType = flashdec.F32
	cache, err := flashdec.NewCache(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer cache.Close()
	ids := []uint64{101, 102, 103}
	for _, id := range ids {
		if err := cache.AddRequest(id); err != nil {
			log.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(1))
	n := len(ids)
	for step := 0; step < 20; step++ {
		tx, err := cache.Begin(ids)
		if err != nil {
			log.Fatal(err)
		}
		var norms []float64
		for layer := uint32(0); layer < layers; layer++ {
			q, k, v := noise(r, n*qHeads*headDim), noise(r, n*kvHeads*headDim), noise(r, n*kvHeads*headDim)
			qRot := make([]float32, len(q))
			if err := flashdec.WriteLayerRope(tx, layer, q, qHeads, k, v, headDim, 10000, qRot); err != nil {
				log.Fatal(err)
			}
			tables, _, err := tx.BlockTables(0)
			if err != nil {
				log.Fatal(err)
			}
			rows, err := tx.Rows()
			if err != nil {
				log.Fatal(err)
			}
			out := make([]float32, len(q))
			if err := flashdec.DecodeLayer(cache, layer, qRot, qHeads, tables, rows.EffectiveSeqLens, out, flashdec.DecodeOptions{}); err != nil {
				log.Fatal(err)
			}
			s := 0.0
			for _, x := range out {
				s += float64(x) * float64(x)
			}
			norms = append(norms, math.Round(math.Sqrt(s)*1000)/1000)
		}
		if err := tx.Commit(); err != nil {
			log.Fatal(err)
		}
		if step%5 == 4 {
			m, _ := cache.Metrics()
			fmt.Printf("step %2d: used_blocks=%d active_tokens=%d |out| per layer=%v\n", step, m.U("used_blocks"), m.U("active_tokens"), norms)
		}
	}
	if err := cache.FinishRequest(101); err != nil {
		log.Fatal(err)
	}
	if err := cache.CancelRequest(102); err != nil {
		log.Fatal(err)
	}
	if err := cache.Validate(); err != nil {
		log.Fatal(err)
	}
	m, _ := cache.Metrics()
	fmt.Printf("done: commits=%d free_blocks=%d\n", m.U("transaction_commit_count"), m.U("free_blocks"))
}
