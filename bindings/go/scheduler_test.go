package flashdec

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newScheduler(t *testing.T, maxActive, maxBatch uint32) *Scheduler {
	t.Helper()
	cfg := DefaultSchedulerConfig()
	cfg.MaxActiveRequests, cfg.MaxBatchRequests = maxActive, maxBatch
	s, err := NewScheduler(cfg)
	must(t, err)
	return s
}

func newSnap(t *testing.T, blockSize, maxBlocks, free uint32) *Snapshot {
	t.Helper()
	info := DefaultSnapshotInfo()
	info.BlockSize, info.MaxBlocks, info.FreeBlocks = blockSize, maxBlocks, free
	s, err := NewSnapshot(info)
	must(t, err)
	return s
}

func ids(t *testing.T, d *Decision, list DecisionList) []uint64 {
	t.Helper()
	v, err := d.IDs(list)
	must(t, err)
	return v
}

func reasons(t *testing.T, d *Decision) []ScheduleReason {
	t.Helper()
	r, err := d.Reasons()
	must(t, err)
	return r
}

func eq[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func TestSchedulerDefaults(t *testing.T) {
	c := DefaultSchedulerConfig()
	eq(t, "scheduler defaults", c, SchedulerConfig{MaxActiveRequests: 64, MaxBatchRequests: 64, AgingThresholdSteps: 8})
	i := DefaultSnapshotInfo()
	eq(t, "snapshot defaults", i, SnapshotInfo{BlockSize: 16, MaxBlocks: 1024, FreeBlocks: 1024})
}

// FIFO admission up to the active limit, with reasons in the fixed order.
func TestSchedulerPlanAdmitsFIFOWithReasons(t *testing.T) {
	s := newScheduler(t, 2, 2)
	defer s.Close()
	cfg, err := s.Config()
	must(t, err)
	eq(t, "config", cfg.MaxActiveRequests, uint32(2))
	snap := newSnap(t, 4, 8, 8)
	defer snap.Close()
	for i := uint64(0); i < 3; i++ {
		must(t, snap.AddWaiting(RequestSpec{ID: 10 + i, MaxNewTokens: 4, SubmissionOrder: i}, 0, 0))
	}
	d, err := s.Plan(snap)
	must(t, err)
	defer d.Close()
	eq(t, "admit", ids(t, d, DecisionAdmit), []uint64{10, 11})
	eq(t, "runnable", ids(t, d, DecisionRunnable), []uint64{10, 11})
	eq(t, "waiting", ids(t, d, DecisionWaiting), []uint64{12})
	eq(t, "deferred", ids(t, d, DecisionDeferred), []uint64{})
	eq(t, "rejected", ids(t, d, DecisionRejected), []uint64{})
	eq(t, "reasons", reasons(t, d), []ScheduleReason{ReasonActiveLimit, ReasonAdmitted})
	eq(t, "reason name", ReasonActiveLimit.String(), "active_limit")
	sum, err := d.Summary()
	must(t, err)
	eq(t, "summary", sum, DecisionSummary{CommittedBlocksAfter: 2, NeededPhysicalBlocksNow: 2, FreeBlocksBefore: 8,
		SchedulableBlocks: 8, ReasonCount: 2})
	dc, err := d.Config()
	must(t, err)
	eq(t, "decision config", dc, cfg)
	copySnap, err := d.Snapshot()
	must(t, err)
	defer copySnap.Close()
	info, err := copySnap.Info()
	must(t, err)
	eq(t, "copied snapshot", info, SnapshotInfo{BlockSize: 4, MaxBlocks: 8, FreeBlocks: 8})
	// The copy plans to the same decision.
	d2, err := s.Plan(copySnap)
	must(t, err)
	defer d2.Close()
	eq(t, "re-plan admit", ids(t, d2, DecisionAdmit), []uint64{10, 11})
}

// Rejection of an oversized request, capacity deferral of a large one that a
// smaller later one overtakes, and the batch limit over active requests.
func TestSchedulerRejectDeferAndBatchLimit(t *testing.T) {
	s := newScheduler(t, 4, 1)
	defer s.Close()
	// 8 blocks of 4 tokens: request 1 (active, 2 blocks committed, 1 held),
	// request 2 needs 9 blocks (never fits), request 3 needs 7 (> 6 left),
	// request 4 needs 1.
	snap := newSnap(t, 4, 8, 7)
	defer snap.Close()
	must(t, snap.AddActive(RequestSpec{ID: 1, MaxNewTokens: 8, SubmissionOrder: 0},
		ActiveState{SeqLen: 3, PhysicalBlocks: 1, CommittedBlocks: 2}))
	must(t, snap.AddWaiting(RequestSpec{ID: 2, MaxNewTokens: 36, SubmissionOrder: 1}, 0, 0))
	must(t, snap.AddWaiting(RequestSpec{ID: 3, MaxNewTokens: 28, SubmissionOrder: 2}, 0, 0))
	must(t, snap.AddWaiting(RequestSpec{ID: 4, MaxNewTokens: 4, SubmissionOrder: 3}, 0, 0))
	d, err := s.Plan(snap)
	must(t, err)
	defer d.Close()
	eq(t, "rejected", ids(t, d, DecisionRejected), []uint64{2})
	eq(t, "admit", ids(t, d, DecisionAdmit), []uint64{4})
	eq(t, "waiting", ids(t, d, DecisionWaiting), []uint64{3})
	eq(t, "runnable", ids(t, d, DecisionRunnable), []uint64{1})
	eq(t, "deferred", ids(t, d, DecisionDeferred), []uint64{4})
	eq(t, "reasons", reasons(t, d), []ScheduleReason{ReasonRequestExceedsCapacity, ReasonCapacityDeferred,
		ReasonAdmitted, ReasonBatchLimit})
	sum, err := d.Summary()
	must(t, err)
	eq(t, "committed before/after", [2]uint32{sum.CommittedBlocksBefore, sum.CommittedBlocksAfter}, [2]uint32{2, 3})
}

// An aged request that does not fit drains the queue: nothing is admitted.
func TestSchedulerAgingDrainAndIdle(t *testing.T) {
	s := newScheduler(t, 4, 4)
	defer s.Close()
	snap := newSnap(t, 4, 4, 2)
	defer snap.Close()
	must(t, snap.AddActive(RequestSpec{ID: 1, MaxNewTokens: 8, InitialContextTokens: 0, SubmissionOrder: 0},
		ActiveState{SeqLen: 5, PhysicalBlocks: 2, CommittedBlocks: 2, ServiceWaitSteps: 3}))
	must(t, snap.AddWaiting(RequestSpec{ID: 2, MaxNewTokens: 12, SubmissionOrder: 1}, 8, 0))
	must(t, snap.AddWaiting(RequestSpec{ID: 3, MaxNewTokens: 1, SubmissionOrder: 2}, 0, 0))
	d, err := s.Plan(snap)
	must(t, err)
	defer d.Close()
	eq(t, "admit", ids(t, d, DecisionAdmit), []uint64{})
	eq(t, "waiting", ids(t, d, DecisionWaiting), []uint64{2, 3})
	eq(t, "reasons", reasons(t, d), []ScheduleReason{ReasonAgingDrain})
	sum, err := d.Summary()
	must(t, err)
	if !sum.HasDrain || sum.DrainForRequestID != 2 {
		t.Fatalf("drain: %+v", sum)
	}
	empty := newSnap(t, 4, 4, 4)
	defer empty.Close()
	idle, err := s.Plan(empty)
	must(t, err)
	defer idle.Close()
	eq(t, "idle reasons", reasons(t, idle), []ScheduleReason{ReasonIdle})
}

func TestSchedulerErrors(t *testing.T) {
	cfg := DefaultSchedulerConfig()
	cfg.MaxActiveRequests = 0
	_, err := NewScheduler(cfg)
	asError(t, err, InvalidArgument, "max_active_requests")
	cfg = DefaultSchedulerConfig()
	cfg.MaxBatchRequests = cfg.MaxActiveRequests + 1
	_, err = NewScheduler(cfg)
	asError(t, err, InvalidArgument, "max_batch_requests")

	info := DefaultSnapshotInfo()
	info.BlockSize, info.MaxBlocks, info.FreeBlocks = 4, 2, 3
	_, err = NewSnapshot(info)
	asError(t, err, InvalidArgument, "free_blocks")

	snap := newSnap(t, 4, 8, 8)
	defer snap.Close()
	must(t, snap.AddWaiting(RequestSpec{ID: 1, MaxNewTokens: 4, SubmissionOrder: 0}, 0, 0))
	asError(t, snap.AddWaiting(RequestSpec{ID: 1, MaxNewTokens: 4, SubmissionOrder: 5}, 0, 0), AlreadyExists, "1")
	asError(t, snap.AddWaiting(RequestSpec{ID: 2, MaxNewTokens: 4, SubmissionOrder: 0}, 0, 0), AlreadyExists, "submission_order")
	asError(t, snap.AddWaiting(RequestSpec{ID: 3, SubmissionOrder: 7}, 0, 0), InvalidArgument, "max_new_tokens")
	asError(t, snap.AddWaiting(RequestSpec{ID: 4, MaxNewTokens: 1, SubmissionOrder: 8, PrefixID: "p\x00q"}, 0, 0),
		InvalidArgument, "NUL")
	asError(t, snap.AddActive(RequestSpec{ID: 5, MaxNewTokens: 8, SubmissionOrder: 9},
		ActiveState{SeqLen: 5, PhysicalBlocks: 1, CommittedBlocks: 2}), InvalidArgument, "physical_blocks")
	// None of the refused entries was added: only request 1 is planned.
	s := newScheduler(t, 4, 4)
	defer s.Close()
	d, err := s.Plan(snap)
	must(t, err)
	eq(t, "admit after refusals", ids(t, d, DecisionAdmit), []uint64{1})
	_, err = d.IDs(DecisionList(9))
	asError(t, err, InvalidArgument, "list")

	// A snapshot whose block accounting does not add up cannot be planned.
	bad := newSnap(t, 4, 8, 6)
	defer bad.Close()
	_, err = s.Plan(bad)
	asError(t, err, InvalidArgument, "free")

	// Closed handles are refused by the binding.
	d.Close()
	d.Close()
	_, err = d.Summary()
	asError(t, err, InvalidState, "decision is closed")
	s.Close()
	_, err = s.Plan(snap)
	asError(t, err, InvalidState, "scheduler is closed")
	snap.Close()
	asError(t, snap.AddWaiting(RequestSpec{ID: 9, MaxNewTokens: 1, SubmissionOrder: 9}, 0, 0), InvalidState, "snapshot is closed")
}

// A scheduler and a built snapshot are read-only: many goroutines may plan
// from them at once and get the same decision.
func TestSchedulerPlansConcurrently(t *testing.T) {
	s := newScheduler(t, 2, 2)
	defer s.Close()
	snap := newSnap(t, 4, 8, 8)
	defer snap.Close()
	for i := uint64(0); i < 3; i++ {
		must(t, snap.AddWaiting(RequestSpec{ID: 10 + i, MaxNewTokens: 4, SubmissionOrder: i}, 0, 0))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				d, err := s.Plan(snap)
				if err != nil {
					errs <- err
					return
				}
				admit, err := d.Admit()
				d.Close()
				if err != nil || !reflect.DeepEqual(admit, []uint64{10, 11}) {
					errs <- fmt.Errorf("admit %v, %v", admit, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
