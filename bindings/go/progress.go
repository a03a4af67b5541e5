package flashdec

// The workload progress callback: C calls this exported function (through a
// trampoline in workload.go) with the cgo.Handle of a *progressState. A file
// with //export may only declare C code in its preamble, hence its own file.

/*
#include <stdint.h>
*/
import "C"

import "runtime/cgo"

//export flashdecGoWorkloadProgress
func flashdecGoWorkloadProgress(handle C.uintptr_t, done, total C.uint64_t) {
	cgo.Handle(handle).Value().(*progressState).report(uint64(done), uint64(total))
}
