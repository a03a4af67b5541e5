package flashdec

/*
#include <stdlib.h>
#include "flashdec.h"
*/
import "C"

import (
	"runtime"
	"strconv"
	"unsafe"
)

// The scheduler (docs/semantics.md S9): a pure planner. Scheduler and Decision are
// immutable and safe to share between goroutines; a Snapshot is externally
// synchronised while it is being built and read-only afterwards.

// SchedulerConfig mirrors fd_scheduler_config. DefaultSchedulerConfig gives the library defaults.
type SchedulerConfig struct {
	MaxActiveRequests   uint32
	MaxBatchRequests    uint32
	ReserveBlocks       uint32
	AgingThresholdSteps uint32
}

// DefaultSchedulerConfig returns fd_scheduler_config_init's defaults.
func DefaultSchedulerConfig() SchedulerConfig {
	var c C.fd_scheduler_config
	C.fd_scheduler_config_init(&c)
	return schedulerConfigFromC(&c)
}

func schedulerConfigFromC(c *C.fd_scheduler_config) SchedulerConfig {
	return SchedulerConfig{
		MaxActiveRequests: uint32(c.max_active_requests), MaxBatchRequests: uint32(c.max_batch_requests),
		ReserveBlocks: uint32(c.reserve_blocks), AgingThresholdSteps: uint32(c.aging_threshold_steps),
	}
}

func (cfg SchedulerConfig) toC() C.fd_scheduler_config {
	var c C.fd_scheduler_config
	C.fd_scheduler_config_init(&c)
	c.max_active_requests, c.max_batch_requests = C.uint32_t(cfg.MaxActiveRequests), C.uint32_t(cfg.MaxBatchRequests)
	c.reserve_blocks, c.aging_threshold_steps = C.uint32_t(cfg.ReserveBlocks), C.uint32_t(cfg.AgingThresholdSteps)
	return c
}

// Scheduler is a block-aware planner (fd_scheduler). Close it when done.
type Scheduler struct{ h *C.fd_scheduler }

// NewScheduler creates a scheduler.
func NewScheduler(cfg SchedulerConfig) (*Scheduler, error) {
	c := cfg.toC()
	var h *C.fd_scheduler
	if err := call(func() C.fd_status { return C.fd_scheduler_create(&c, &h) }); err != nil {
		return nil, err
	}
	s := &Scheduler{h: h}
	runtime.SetFinalizer(s, (*Scheduler).Close)
	return s, nil
}

// Close destroys the scheduler; idempotent. Its decisions stay valid.
func (s *Scheduler) Close() {
	if s.h != nil {
		C.fd_scheduler_destroy(s.h)
		s.h = nil
	}
	runtime.SetFinalizer(s, nil)
}

func closedError(what string) error {
	return &Error{Status: InvalidState, Message: what + " is closed"}
}

func (s *Scheduler) handle() (*C.fd_scheduler, error) {
	if s == nil || s.h == nil {
		return nil, closedError("scheduler")
	}
	return s.h, nil
}

// Config reads the scheduler's configuration back.
func (s *Scheduler) Config() (SchedulerConfig, error) {
	h, err := s.handle()
	if err != nil {
		return SchedulerConfig{}, err
	}
	var c C.fd_scheduler_config
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	err = call(func() C.fd_status { return C.fd_scheduler_get_config(h, &c) })
	runtime.KeepAlive(s)
	return schedulerConfigFromC(&c), err
}

// Plan plans one step from snap (pure, deterministic). Close the decision when done.
func (s *Scheduler) Plan(snap *Snapshot) (*Decision, error) {
	h, err := s.handle()
	if err != nil {
		return nil, err
	}
	sh, err := snap.handle()
	if err != nil {
		return nil, err
	}
	var d *C.fd_decision
	err = call(func() C.fd_status { return C.fd_scheduler_plan(h, sh, &d) })
	runtime.KeepAlive(s)
	runtime.KeepAlive(snap)
	if err != nil {
		return nil, err
	}
	return newDecision(d), nil
}

// RequestSpec mirrors fd_request_spec: what the scheduler knows about a
// request. MaxNewTokens must be at least 1 (the zero value is refused by the
// library). PrefixID "" means no prefix.
type RequestSpec struct {
	ID                   uint64
	InitialContextTokens uint32
	MaxNewTokens         uint32
	SubmissionOrder      uint64
	PrefixBlocks         uint32
	PrefixID             string
}

// withC hands f the C form of the spec; the prefix id lives in C memory
// (the struct may then be Go memory: it holds no Go pointer) until f returns.
func (spec RequestSpec) withC(f func(c *C.fd_request_spec) error) error {
	var c C.fd_request_spec
	C.fd_request_spec_init(&c)
	c.id, c.initial_context_tokens = C.uint64_t(spec.ID), C.uint32_t(spec.InitialContextTokens)
	c.max_new_tokens, c.submission_order = C.uint32_t(spec.MaxNewTokens), C.uint64_t(spec.SubmissionOrder)
	c.prefix_blocks = C.uint32_t(spec.PrefixBlocks)
	if spec.PrefixID != "" {
		cid, err := prefixCString(spec.PrefixID)
		if err != nil {
			return err
		}
		defer C.free(unsafe.Pointer(cid))
		c.prefix_id = cid
	}
	return f(&c)
}

// SnapshotInfo mirrors fd_snapshot_info (the pool-wide part of a snapshot).
type SnapshotInfo struct {
	BlockSize, MaxBlocks, FreeBlocks, ResidentPrefixBlocks uint32
	Step, Version                                          uint64
}

// DefaultSnapshotInfo returns fd_snapshot_info_init's defaults.
func DefaultSnapshotInfo() SnapshotInfo {
	var i C.fd_snapshot_info
	C.fd_snapshot_info_init(&i)
	return snapshotInfoFromC(&i)
}

func snapshotInfoFromC(i *C.fd_snapshot_info) SnapshotInfo {
	return SnapshotInfo{
		BlockSize: uint32(i.block_size), MaxBlocks: uint32(i.max_blocks), FreeBlocks: uint32(i.free_blocks),
		ResidentPrefixBlocks: uint32(i.resident_prefix_blocks), Step: uint64(i.step), Version: uint64(i.version),
	}
}

// Snapshot is scheduler input (fd_snapshot): pool numbers plus waiting and
// active requests. Close it when done.
type Snapshot struct{ h *C.fd_snapshot }

func newSnapshot(h *C.fd_snapshot) *Snapshot {
	s := &Snapshot{h: h}
	runtime.SetFinalizer(s, (*Snapshot).Close)
	return s
}

// NewSnapshot starts an empty snapshot.
func NewSnapshot(info SnapshotInfo) (*Snapshot, error) {
	var i C.fd_snapshot_info
	C.fd_snapshot_info_init(&i)
	i.block_size, i.max_blocks, i.free_blocks = C.uint32_t(info.BlockSize), C.uint32_t(info.MaxBlocks), C.uint32_t(info.FreeBlocks)
	i.resident_prefix_blocks = C.uint32_t(info.ResidentPrefixBlocks)
	i.step, i.version = C.uint64_t(info.Step), C.uint64_t(info.Version)
	var h *C.fd_snapshot
	if err := call(func() C.fd_status { return C.fd_snapshot_create(&i, &h) }); err != nil {
		return nil, err
	}
	return newSnapshot(h), nil
}

// Close destroys the snapshot; idempotent.
func (s *Snapshot) Close() {
	if s.h != nil {
		C.fd_snapshot_destroy(s.h)
		s.h = nil
	}
	runtime.SetFinalizer(s, nil)
}

func (s *Snapshot) handle() (*C.fd_snapshot, error) {
	if s == nil || s.h == nil {
		return nil, closedError("snapshot")
	}
	return s.h, nil
}

func (s *Snapshot) do(f func(h *C.fd_snapshot) C.fd_status) error {
	h, err := s.handle()
	if err != nil {
		return err
	}
	err = call(func() C.fd_status { return f(h) })
	runtime.KeepAlive(s)
	return err
}

// Info reads the pool-wide part of the snapshot.
func (s *Snapshot) Info() (SnapshotInfo, error) {
	var i C.fd_snapshot_info
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	err := s.do(func(h *C.fd_snapshot) C.fd_status { return C.fd_snapshot_get_info(h, &i) })
	return snapshotInfoFromC(&i), err
}

// AddWaiting appends a waiting request with its fairness counters.
func (s *Snapshot) AddWaiting(spec RequestSpec, waitSteps, skipCount uint32) error {
	return spec.withC(func(c *C.fd_request_spec) error {
		return s.do(func(h *C.fd_snapshot) C.fd_status {
			return C.fd_snapshot_add_waiting(h, c, C.uint32_t(waitSteps), C.uint32_t(skipCount))
		})
	})
}

// ActiveState is the block accounting of an active request (fd_snapshot_add_active).
type ActiveState struct {
	SeqLen                                        int32
	PhysicalBlocks, SharedBlocks, CommittedBlocks uint32
	ServiceWaitSteps                              uint32
}

// AddActive appends an active request (one holding blocks).
func (s *Snapshot) AddActive(spec RequestSpec, a ActiveState) error {
	return spec.withC(func(c *C.fd_request_spec) error {
		return s.do(func(h *C.fd_snapshot) C.fd_status {
			return C.fd_snapshot_add_active(h, c, C.int32_t(a.SeqLen), C.uint32_t(a.PhysicalBlocks),
				C.uint32_t(a.SharedBlocks), C.uint32_t(a.CommittedBlocks), C.uint32_t(a.ServiceWaitSteps))
		})
	})
}

// ScheduleReason is an fd_schedule_reason; decisions report them in this order.
type ScheduleReason int32

const (
	ReasonRequestExceedsCapacity ScheduleReason = C.FD_REASON_REQUEST_EXCEEDS_CAPACITY
	ReasonAgingDrain             ScheduleReason = C.FD_REASON_AGING_DRAIN
	ReasonActiveLimit            ScheduleReason = C.FD_REASON_ACTIVE_LIMIT
	ReasonCapacityDeferred       ScheduleReason = C.FD_REASON_CAPACITY_DEFERRED
	ReasonAdmitted               ScheduleReason = C.FD_REASON_ADMITTED
	ReasonBatchLimit             ScheduleReason = C.FD_REASON_BATCH_LIMIT
	ReasonIdle                   ScheduleReason = C.FD_REASON_IDLE
)

var reasonNames = [...]string{"request_exceeds_capacity", "aging_drain", "active_limit", "capacity_deferred",
	"admitted", "batch_limit", "idle"}

// String is the docs/semantics.md name, e.g. "active_limit".
func (r ScheduleReason) String() string {
	if r >= 0 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// DecisionList is an fd_decision_list: which id list of a decision.
type DecisionList int32

const (
	DecisionAdmit    DecisionList = C.FD_DECISION_ADMIT
	DecisionRunnable DecisionList = C.FD_DECISION_RUNNABLE
	DecisionDeferred DecisionList = C.FD_DECISION_DEFERRED
	DecisionWaiting  DecisionList = C.FD_DECISION_WAITING
	DecisionRejected DecisionList = C.FD_DECISION_REJECTED
)

// DecisionSummary mirrors fd_decision_summary.
type DecisionSummary struct {
	HasDrain                                    bool
	Step, SnapshotVersion, DrainForRequestID    uint64
	CommittedBlocksBefore, CommittedBlocksAfter uint32
	NeededPhysicalBlocksNow, FreeBlocksBefore   uint32
	SchedulableBlocks, ReasonCount              uint32
}

// Decision is an immutable scheduler output (fd_decision). Close it when done.
type Decision struct{ h *C.fd_decision }

func newDecision(h *C.fd_decision) *Decision {
	d := &Decision{h: h}
	runtime.SetFinalizer(d, (*Decision).Close)
	return d
}

// Close destroys the decision; idempotent.
func (d *Decision) Close() {
	if d.h != nil {
		C.fd_decision_destroy(d.h)
		d.h = nil
	}
	runtime.SetFinalizer(d, nil)
}

func (d *Decision) handle() (*C.fd_decision, error) {
	if d == nil || d.h == nil {
		return nil, closedError("decision")
	}
	return d.h, nil
}

func (d *Decision) do(f func(h *C.fd_decision) C.fd_status) error {
	h, err := d.handle()
	if err != nil {
		return err
	}
	err = call(func() C.fd_status { return f(h) })
	runtime.KeepAlive(d)
	return err
}

// IDs copies one id list (never nil on success).
func (d *Decision) IDs(list DecisionList) ([]uint64, error) {
	var n C.uint32_t
	if err := d.do(func(h *C.fd_decision) C.fd_status { return C.fd_decision_ids(h, C.int32_t(list), nil, 0, &n) }); err != nil {
		return nil, err
	}
	ids := make([]uint64, int(n))
	err := d.do(func(h *C.fd_decision) C.fd_status {
		return C.fd_decision_ids(h, C.int32_t(list), idsPtr(ids), C.uint32_t(len(ids)), &n)
	})
	if err != nil {
		return nil, err
	}
	return ids[:n], nil
}

// Admit lists the requests admitted by this decision, in admission order.
func (d *Decision) Admit() ([]uint64, error) { return d.IDs(DecisionAdmit) }

// Runnable lists the rows of this step, in row order.
func (d *Decision) Runnable() ([]uint64, error) { return d.IDs(DecisionRunnable) }

// Deferred lists active or admitted requests left out by the batch limit.
func (d *Decision) Deferred() ([]uint64, error) { return d.IDs(DecisionDeferred) }

// Waiting lists the requests still waiting, in submission order.
func (d *Decision) Waiting() ([]uint64, error) { return d.IDs(DecisionWaiting) }

// Rejected lists the requests rejected as larger than the schedulable pool.
func (d *Decision) Rejected() ([]uint64, error) { return d.IDs(DecisionRejected) }

// Summary reads the decision's numbers.
func (d *Decision) Summary() (DecisionSummary, error) {
	var s C.fd_decision_summary
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	if err := d.do(func(h *C.fd_decision) C.fd_status { return C.fd_decision_get_summary(h, &s) }); err != nil {
		return DecisionSummary{}, err
	}
	return DecisionSummary{
		HasDrain: s.has_drain != 0, Step: uint64(s.step), SnapshotVersion: uint64(s.snapshot_version),
		DrainForRequestID:     uint64(s.drain_for_request_id),
		CommittedBlocksBefore: uint32(s.committed_blocks_before), CommittedBlocksAfter: uint32(s.committed_blocks_after),
		NeededPhysicalBlocksNow: uint32(s.needed_physical_blocks_now), FreeBlocksBefore: uint32(s.free_blocks_before),
		SchedulableBlocks: uint32(s.schedulable_blocks), ReasonCount: uint32(s.reason_count),
	}, nil
}

// Reasons lists why the decision looks the way it does, in the fixed order.
func (d *Decision) Reasons() ([]ScheduleReason, error) {
	var buf [8]C.int32_t // 7 reasons exist; each appears at most once
	var n C.uint32_t
	if err := d.do(func(h *C.fd_decision) C.fd_status {
		return C.fd_decision_reasons(h, &buf[0], C.uint32_t(len(buf)), &n)
	}); err != nil {
		return nil, err
	}
	out := make([]ScheduleReason, int(n))
	for i := range out {
		out[i] = ScheduleReason(buf[i])
	}
	return out, nil
}

// Config is the configuration the decision was planned with.
func (d *Decision) Config() (SchedulerConfig, error) {
	var c C.fd_scheduler_config
	c.struct_size = C.uint32_t(unsafe.Sizeof(c))
	err := d.do(func(h *C.fd_decision) C.fd_status { return C.fd_decision_get_config(h, &c) })
	return schedulerConfigFromC(&c), err
}

// Snapshot returns a copy of the snapshot the decision was planned from.
func (d *Decision) Snapshot() (*Snapshot, error) {
	var s *C.fd_snapshot
	if err := d.do(func(h *C.fd_decision) C.fd_status { return C.fd_decision_copy_snapshot(h, &s) }); err != nil {
		return nil, err
	}
	return newSnapshot(s), nil
}
