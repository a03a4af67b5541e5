package flashdec

import (
	"reflect"
	"strings"
	"testing"
)

func boundaryDeadlock(t *testing.T, progress func(done, total uint64)) []WorkloadRun {
	t.Helper()
	o := DefaultWorkloadOptions()
	o.CaseName, o.Progress = "boundary_deadlock", progress
	runs, err := RunWorkload(o)
	must(t, err)
	return runs
}

func TestWorkloadCases(t *testing.T) {
	eq(t, "default options", DefaultWorkloadOptions(), WorkloadOptions{Kind: WorkloadScheduler, CPUThreads: 1})
	cases, err := WorkloadCases(WorkloadScheduler)
	must(t, err)
	for _, want := range []string{"boundary_deadlock", "finite_queue"} {
		found := false
		for _, c := range cases {
			found = found || c == want
		}
		if !found {
			t.Fatalf("scheduler cases %v lack %s", cases, want)
		}
	}
	synthetic, err := WorkloadCases(WorkloadSynthetic)
	must(t, err)
	eq(t, "synthetic cases", synthetic, []string{"short_churn", "mixed_steady", "long_pressure"})
	_, err = WorkloadCases(WorkloadKind(7))
	asError(t, err, InvalidArgument, "7")
}

// docs/semantics.md S10: 2 requests of 64 new tokens on 2 blocks of 32: greedy
// deadlocks, cancel-on-backpressure completes 1 of 2, lifetime 2 of 2.
func TestWorkloadBoundaryDeadlock(t *testing.T) {
	var calls, last, total uint64
	monotone := true
	runs := boundaryDeadlock(t, func(done, tot uint64) {
		calls++
		monotone = monotone && done >= last && done <= tot && (total == 0 || tot == total)
		last, total = done, tot
	})
	if calls == 0 || !monotone || last != total {
		t.Fatalf("progress: %d calls, monotone %v, last %d of %d", calls, monotone, last, total)
	}
	eq(t, "runs", len(runs), 3)
	byPolicy := map[WorkloadPolicy]WorkloadRun{}
	for _, r := range runs {
		byPolicy[r.Report.Policy] = r
		eq(t, "case name", r.Report.CaseName, "boundary_deadlock")
		eq(t, "kind", r.Report.Kind, WorkloadScheduler)
		eq(t, "submitted", r.Report.RequestsSubmitted, uint64(2))
		eq(t, "max_blocks", r.Report.MaxBlocks, uint32(2))
		eq(t, "trace length", uint64(len(r.Trace)), r.Report.Steps)
		for i, p := range r.Trace {
			if p.UsedBlocks > r.Report.MaxBlocks || (i > 0 && p.Step <= r.Trace[i-1].Step) {
				t.Fatalf("policy %d trace point %d: %+v", r.Report.Policy, i, p)
			}
		}
	}
	lifetime, greedy, cancel := byPolicy[PolicyLifetime].Report, byPolicy[PolicyGreedy].Report,
		byPolicy[PolicyCancelOnBackpressure].Report
	eq(t, "lifetime completed/deadlocks", [2]uint64{lifetime.RequestsCompleted, lifetime.Deadlocks}, [2]uint64{2, 0})
	eq(t, "lifetime tokens", lifetime.UsefulTokens, uint64(128))
	eq(t, "lifetime completion rate", lifetime.CompletionRate, 1.0)
	eq(t, "greedy completed/deadlocks", [2]uint64{greedy.RequestsCompleted, greedy.Deadlocks}, [2]uint64{0, 1})
	eq(t, "cancel completed", cancel.RequestsCompleted, uint64(1))
	if cancel.ForcedCancellations == 0 || cancel.Deadlocks != 0 {
		t.Fatalf("cancel-on-backpressure: %+v", cancel)
	}

	// Deterministic: a second run (without progress) has the same trajectories.
	again := boundaryDeadlock(t, nil)
	for i := range runs {
		eq(t, "trajectory hash", again[i].Report.TrajectoryHash, runs[i].Report.TrajectoryHash)
	}
}

// Every numeric C field of fd_workload_report reaches the Go field named by its c tag.
func TestWorkloadReportMirrorsEveryField(t *testing.T) {
	run := boundaryDeadlock(t, nil)[0]
	v := reflect.ValueOf(run.Report)
	byTag := map[string]reflect.Value{}
	for i := 0; i < v.NumField(); i++ {
		byTag[v.Type().Field(i).Tag.Get("c")] = v.Field(i)
	}
	if len(run.raw) == 0 {
		t.Fatal("no raw fields")
	}
	for _, m := range run.raw {
		f, ok := byTag[m.Name]
		if !ok {
			t.Fatalf("C field %s has no Go field", m.Name)
		}
		switch f.Kind() {
		case reflect.Float64:
			if !m.IsFloat || f.Float() != m.Float {
				t.Fatalf("%s: Go %v, C %+v", m.Name, f.Float(), m)
			}
		case reflect.Int32:
			if uint64(f.Int()) != m.Uint {
				t.Fatalf("%s: Go %v, C %+v", m.Name, f.Int(), m)
			}
		default:
			if f.Uint() != m.Uint {
				t.Fatalf("%s: Go %v, C %+v", m.Name, f.Uint(), m)
			}
		}
		delete(byTag, m.Name)
	}
	eq(t, "Go fields without a numeric C field", len(byTag), 1) // case_name (a char array)
}

func TestWorkloadErrors(t *testing.T) {
	o := DefaultWorkloadOptions()
	o.CaseName = "no_such_case"
	_, err := RunWorkload(o)
	asError(t, err, NotFound, "no_such_case")
	o.CaseName, o.Kind = "boundary_deadlock", WorkloadKind(9)
	_, err = RunWorkload(o)
	asError(t, err, InvalidArgument, "9")
	o.Kind, o.CaseName = WorkloadScheduler, "boundary\x00deadlock"
	_, err = RunWorkload(o)
	asError(t, err, InvalidArgument, "NUL")
}

// A panic in the progress callback does not unwind through the library: the
// run finishes, its result is freed, and the panic reaches the caller.
func TestWorkloadProgressPanic(t *testing.T) {
	calls := 0
	defer func() {
		r := recover()
		if s, ok := r.(string); !ok || !strings.Contains(s, "stop here") {
			t.Fatalf("recovered %v", r)
		}
		eq(t, "callback calls after the panic", calls, 1)
	}()
	boundaryDeadlock(t, func(done, total uint64) {
		calls++
		panic("stop here")
	})
	t.Fatal("no panic")
}
