package flashdec

/*
#include <stdint.h>
#include <stdlib.h>
#include "flashdec.h"

// Defined with //export in progress.go.
extern void flashdecGoWorkloadProgress(uintptr_t handle, uint64_t done, uint64_t total);

static void fd_go_workload_progress(void *user_data, uint64_t done, uint64_t total) {
	flashdecGoWorkloadProgress((uintptr_t)user_data, done, total);
}

// Sets the progress trampoline in C so the handle (an integer) never sits in
// a Go pointer slot.
static void fd_go_set_progress(fd_workload_options *o, uintptr_t handle) {
	o->progress = fd_go_workload_progress;
	o->progress_user_data = (void *)handle;
}
*/
import "C"

import (
	"runtime"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// Workload drivers (docs/semantics.md S10): deterministic, seeded scenarios on the
// CPU backend. Stateless and safe to call from many goroutines.

// WorkloadKind is an fd_workload_kind.
type WorkloadKind int32

const (
	WorkloadSynthetic  WorkloadKind = C.FD_WORKLOAD_SYNTHETIC
	WorkloadScheduler  WorkloadKind = C.FD_WORKLOAD_SCHEDULER
	WorkloadIntegrated WorkloadKind = C.FD_WORKLOAD_INTEGRATED
)

// WorkloadPolicy is an fd_workload_policy.
type WorkloadPolicy int32

const (
	PolicyUnscheduled          WorkloadPolicy = C.FD_POLICY_UNSCHEDULED
	PolicyLifetime             WorkloadPolicy = C.FD_POLICY_LIFETIME
	PolicyGreedy               WorkloadPolicy = C.FD_POLICY_GREEDY
	PolicyCancelOnBackpressure WorkloadPolicy = C.FD_POLICY_CANCEL_ON_BACKPRESSURE
)

// WorkloadCases names the cases of a workload kind.
func WorkloadCases(kind WorkloadKind) ([]string, error) {
	names := []string{}
	for index := uint32(0); ; index++ {
		var name *C.char
		err := call(func() C.fd_status { return C.fd_workload_case_name(C.int32_t(kind), C.uint32_t(index), &name) })
		if e, ok := err.(*Error); ok && e.Status == NotFound {
			return names, nil
		}
		if err != nil {
			return nil, err
		}
		names = append(names, C.GoString(name))
	}
}

// WorkloadOptions mirrors fd_workload_options. Progress, when set, is called
// now and then on the calling goroutine with the units of work done so far;
// a panic in it is re-raised once the run has returned.
type WorkloadOptions struct {
	Kind       WorkloadKind
	CaseName   string
	Seed       uint64
	CPUThreads uint32
	Progress   func(done, total uint64)
}

// DefaultWorkloadOptions returns fd_workload_options_init's defaults (no case name).
func DefaultWorkloadOptions() WorkloadOptions {
	var o C.fd_workload_options
	C.fd_workload_options_init(&o)
	return WorkloadOptions{Kind: WorkloadKind(o.kind), Seed: uint64(o.seed), CPUThreads: uint32(o.cpu_threads)}
}

// WorkloadReport mirrors fd_workload_report; the c tags name the C fields.
// Latencies are wall clock; every other field is deterministic per case and seed.
type WorkloadReport struct {
	Kind                   WorkloadKind   `c:"kind"`
	Policy                 WorkloadPolicy `c:"policy"`
	MaxBlocks              uint32         `c:"max_blocks"`
	CaseName               string         `c:"case_name"`
	Seed                   uint64         `c:"seed"`
	Steps                  uint64         `c:"steps"`
	ExecutedSteps          uint64         `c:"executed_steps"`
	RequestsSubmitted      uint64         `c:"requests_submitted"`
	RequestsCompleted      uint64         `c:"requests_completed"`
	CompletionRate         float64        `c:"completion_rate"`
	UsefulTokens           uint64         `c:"useful_tokens"`
	GeneratedTokens        uint64         `c:"generated_tokens"`
	TokensPerSecond        float64        `c:"tokens_per_second"`
	StepLatencyP50US       float64        `c:"step_latency_p50_us"`
	StepLatencyP90US       float64        `c:"step_latency_p90_us"`
	StepLatencyP99US       float64        `c:"step_latency_p99_us"`
	StalledSteps           uint64         `c:"stalled_steps"`
	BackpressureSteps      uint64         `c:"backpressure_steps"`
	Deadlocks              uint64         `c:"deadlocks"`
	ForcedCancellations    uint64         `c:"forced_cancellations"`
	UserCancellations      uint64         `c:"user_cancellations"`
	RejectedRequests       uint64         `c:"rejected_requests"`
	AbortedSteps           uint64         `c:"aborted_steps"`
	MeanAdmissionWaitSteps float64        `c:"mean_admission_wait_steps"`
	MaxAdmissionWaitSteps  uint64         `c:"max_admission_wait_steps"`
	MaxServiceWaitSteps    uint64         `c:"max_service_wait_steps"`
	Fairness               float64        `c:"fairness"`
	PeakUsedBlocks         uint64         `c:"peak_used_blocks"`
	MeanUsedBlocks         float64        `c:"mean_used_blocks"`
	PrefixHits             uint64         `c:"prefix_hits"`
	PrefixMisses           uint64         `c:"prefix_misses"`
	PeakSavedPrefixBlocks  uint64         `c:"peak_saved_prefix_blocks"`
	TrajectoryHash         uint64         `c:"trajectory_hash"`
}

func reportFromC(r *C.fd_workload_report) WorkloadReport {
	name := C.GoStringN(&r.case_name[0], C.int(len(r.case_name)))
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return WorkloadReport{
		Kind: WorkloadKind(r.kind), Policy: WorkloadPolicy(r.policy), MaxBlocks: uint32(r.max_blocks), CaseName: name,
		Seed: uint64(r.seed), Steps: uint64(r.steps), ExecutedSteps: uint64(r.executed_steps),
		RequestsSubmitted: uint64(r.requests_submitted), RequestsCompleted: uint64(r.requests_completed),
		CompletionRate: float64(r.completion_rate), UsefulTokens: uint64(r.useful_tokens),
		GeneratedTokens: uint64(r.generated_tokens), TokensPerSecond: float64(r.tokens_per_second),
		StepLatencyP50US: float64(r.step_latency_p50_us), StepLatencyP90US: float64(r.step_latency_p90_us),
		StepLatencyP99US: float64(r.step_latency_p99_us), StalledSteps: uint64(r.stalled_steps),
		BackpressureSteps: uint64(r.backpressure_steps), Deadlocks: uint64(r.deadlocks),
		ForcedCancellations: uint64(r.forced_cancellations), UserCancellations: uint64(r.user_cancellations),
		RejectedRequests: uint64(r.rejected_requests), AbortedSteps: uint64(r.aborted_steps),
		MeanAdmissionWaitSteps: float64(r.mean_admission_wait_steps),
		MaxAdmissionWaitSteps:  uint64(r.max_admission_wait_steps),
		MaxServiceWaitSteps:    uint64(r.max_service_wait_steps), Fairness: float64(r.fairness),
		PeakUsedBlocks: uint64(r.peak_used_blocks), MeanUsedBlocks: float64(r.mean_used_blocks),
		PrefixHits: uint64(r.prefix_hits), PrefixMisses: uint64(r.prefix_misses),
		PeakSavedPrefixBlocks: uint64(r.peak_saved_prefix_blocks), TrajectoryHash: uint64(r.trajectory_hash),
	}
}

// TracePoint mirrors fd_workload_trace_point: one iteration of a run.
type TracePoint struct {
	Step                                         uint64
	LatencyUS                                    float64
	UsedBlocks, CommittedBlocks, Active, Waiting uint32
}

// WorkloadRun is the report and per-iteration trace of one policy run.
type WorkloadRun struct {
	Report WorkloadReport
	Trace  []TracePoint
	raw    Metrics // every numeric C field of the report, for the mirror test
}

// progressState carries a Go callback through C as a cgo.Handle.
type progressState struct {
	fn       func(done, total uint64)
	panicked bool
	value    interface{}
}

// report runs the callback; a panic must not unwind through the library's
// frames, so it is kept and re-raised after the run.
func (p *progressState) report(done, total uint64) {
	if p.panicked {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			p.panicked, p.value = true, r
		}
	}()
	p.fn(done, total)
}

// RunWorkload runs a workload case to completion: one run per policy (1, or
// 3 for scheduler cases).
func RunWorkload(opts WorkloadOptions) ([]WorkloadRun, error) {
	if strings.IndexByte(opts.CaseName, 0) >= 0 {
		return nil, invalid("case_name must not contain NUL characters")
	}
	// C memory: the options hold C pointers and the progress handle.
	o := (*C.fd_workload_options)(C.calloc(1, C.size_t(unsafe.Sizeof(C.fd_workload_options{}))))
	if o == nil {
		panic("flashdec: C.calloc failed")
	}
	defer C.free(unsafe.Pointer(o))
	C.fd_workload_options_init(o)
	name := C.CString(opts.CaseName)
	defer C.free(unsafe.Pointer(name))
	o.kind, o.case_name, o.seed, o.cpu_threads = C.int32_t(opts.Kind), name, C.uint64_t(opts.Seed), C.uint32_t(opts.CPUThreads)
	var progress *progressState
	if opts.Progress != nil {
		progress = &progressState{fn: opts.Progress}
		handle := cgo.NewHandle(progress)
		defer handle.Delete()
		C.fd_go_set_progress(o, C.uintptr_t(handle))
	}
	var result *C.fd_workload_result
	err := call(func() C.fd_status { return C.fd_workload_run(o, &result) })
	if progress != nil && progress.panicked {
		if err == nil {
			C.fd_workload_result_destroy(result)
		}
		panic(progress.value)
	}
	if err != nil {
		return nil, err
	}
	defer C.fd_workload_result_destroy(result)
	return readWorkloadResult(result)
}

func readWorkloadResult(result *C.fd_workload_result) ([]WorkloadRun, error) {
	var count C.uint32_t
	if err := call(func() C.fd_status { return C.fd_workload_result_count(result, &count) }); err != nil {
		return nil, err
	}
	runs := make([]WorkloadRun, 0, int(count))
	for i := C.uint32_t(0); i < count; i++ {
		var r C.fd_workload_report
		r.struct_size = C.uint32_t(unsafe.Sizeof(r))
		if err := call(func() C.fd_status { return C.fd_workload_result_report(result, i, &r) }); err != nil {
			return nil, err
		}
		var n C.uint32_t
		if err := call(func() C.fd_status { return C.fd_workload_result_trace(result, i, nil, 0, &n) }); err != nil {
			return nil, err
		}
		points := make([]C.fd_workload_trace_point, int(n))
		if n > 0 {
			if err := call(func() C.fd_status { return C.fd_workload_result_trace(result, i, &points[0], n, &n) }); err != nil {
				return nil, err
			}
		}
		trace := make([]TracePoint, int(n))
		for j := range trace {
			p := &points[j]
			trace[j] = TracePoint{Step: uint64(p.step), LatencyUS: float64(p.latency_us), UsedBlocks: uint32(p.used_blocks),
				CommittedBlocks: uint32(p.committed_blocks), Active: uint32(p.active), Waiting: uint32(p.waiting)}
		}
		runs = append(runs, WorkloadRun{Report: reportFromC(&r), Trace: trace, raw: Metrics(structFields(r))})
	}
	runtime.KeepAlive(result)
	return runs, nil
}
