// Package flashdec is a cgo binding of libflashdec, paged-KV decode attention.
//
// Handles have an explicit Close (which also clears the finalizer); a
// finalizer frees forgotten handles as a backstop only. Every C call runs with
// the goroutine locked to its OS thread until the thread-local error message
// has been read, and runtime.KeepAlive keeps Go memory alive across calls.
//
// An Engine borrows its Cache: their calls are serialised by the cache's lock
// and Cache.Close closes the cache's engines first. Scheduler, Decision and a
// built Snapshot are immutable and may be shared between goroutines.
// Generic functions (StepLayer, Prefill, WriteLayer, ...) take float32 slices
// for F32 caches and uint16 bit patterns for F16/BF16; FP8 K/V (a cache's
// storage, decode's K/V, append's pages) travel as uint8 bit patterns.
//
// Build: the header and library come from pkg-config (flashdec.pc, installed
// by `cmake --install`): PKG_CONFIG_PATH=<prefix>/lib/pkgconfig go build.
// The .pc file's rpath lets the program run without LD_LIBRARY_PATH.
package flashdec

/*
#cgo pkg-config: flashdec
#include <stdlib.h>
#include "flashdec.h"
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"unsafe"
)

// Status is an fd_status value.
type Status int32

const (
	OK              Status = C.FD_OK
	InvalidArgument Status = C.FD_ERR_INVALID_ARGUMENT
	OutOfBlocks     Status = C.FD_ERR_OUT_OF_BLOCKS
	NotFound        Status = C.FD_ERR_NOT_FOUND
	InvalidState    Status = C.FD_ERR_INVALID_STATE
	StaleHandle     Status = C.FD_ERR_STALE_HANDLE
	Unsupported     Status = C.FD_ERR_UNSUPPORTED
	NoDevice        Status = C.FD_ERR_NO_DEVICE
	DeviceError     Status = C.FD_ERR_DEVICE
	OutOfMemory     Status = C.FD_ERR_OUT_OF_MEMORY
	Internal        Status = C.FD_ERR_INTERNAL
	AlreadyExists   Status = C.FD_ERR_ALREADY_EXISTS
	Invariant       Status = C.FD_ERR_INVARIANT
)

// String is the library's static name, e.g. "FD_ERR_NOT_FOUND: not found".
func (s Status) String() string { return C.GoString(C.fd_status_string(C.fd_status(s))) }

// Error is a failed call: its status and the library's detail message.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("%s: %s", e.Status, e.Message) }

func invalid(format string, args ...interface{}) error {
	return &Error{Status: InvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// call runs f (one C call) with the goroutine locked to its OS thread and,
// on failure, reads the thread-local message on that same thread.
func call(f func() C.fd_status) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := f()
	if s == C.FD_OK {
		return nil
	}
	return &Error{Status: Status(s), Message: C.GoString(C.fd_last_error_message())}
}

// CheckStatus turns a raw status into an error; exported for tests and raw calls.
func CheckStatus(s int32) error {
	return call(func() C.fd_status { return C.fd_status(s) })
}

// Version is the runtime version "MAJOR.MINOR.PATCH".
func Version() string { return C.GoString(C.fd_version_string()) }

// VersionNumber is major*10000 + minor*100 + patch of the runtime.
func VersionNumber() uint32 { return uint32(C.fd_version_number()) }

// HeaderVersionNumber is FD_VERSION_NUMBER of the header this package was built with.
const HeaderVersionNumber = uint32(C.FD_VERSION_MAJOR*10000 + C.FD_VERSION_MINOR*100 + C.FD_VERSION_PATCH)

// IsCompatible applies the header's rule: runtime at least as new, same major
// version and, while the major is 0 (a 0.x minor may change the ABI), the same
// minor version too.
func IsCompatible(runtimeVersion uint32) bool {
	same := runtimeVersion/10000 == HeaderVersionNumber/10000
	if HeaderVersionNumber/10000 == 0 {
		same = runtimeVersion/100 == HeaderVersionNumber/100
	}
	return same && runtimeVersion >= HeaderVersionNumber
}

// CudaDeviceCount is the number of usable CUDA devices (0 without CUDA).
func CudaDeviceCount() (int, error) {
	var n C.int32_t
	err := call(func() C.fd_status { return C.fd_cuda_device_count(&n) })
	return int(n), err
}

// DType is an fd_dtype. FP8E4M3 and FP8E5M2 (OCP 8-bit floats, uint8 bits
// in Go) are types of stored K/V only: a cache's DType, decode's K/V and
// append's pages (docs/semantics.md S1.1).
type DType int32

const (
	F32     DType = C.FD_DTYPE_F32
	F16     DType = C.FD_DTYPE_F16
	BF16    DType = C.FD_DTYPE_BF16
	FP8E4M3 DType = C.FD_DTYPE_FP8_E4M3 // largest finite 448, NaN 0x7f/0xff, no infinity
	FP8E5M2 DType = C.FD_DTYPE_FP8_E5M2 // largest finite 57344
	// DTypeDefault is CacheConfig.InputDType's default (C's -1): the cache's DType.
	DTypeDefault DType = -1
)

// Size is the bytes of one element (0 for a value that is not an fd_dtype).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case FP8E4M3, FP8E5M2:
		return 1
	}
	return 0
}

// IsFP8 reports the stored-K/V types FP8E4M3 and FP8E5M2.
func (d DType) IsFP8() bool { return d == FP8E4M3 || d == FP8E5M2 }

// FP8ToFloat32 is the value FP8 bits of dtype FP8E4M3 or FP8E5M2 stand for
// (before a scale): exact, NaN for NaN codes, +-Inf for E5M2's infinities.
// Any other dtype gives NaN.
func FP8ToFloat32(dtype DType, bits uint8) float32 {
	mant, bias := 3, 7
	if dtype == FP8E5M2 {
		mant, bias = 2, 15
	} else if dtype != FP8E4M3 {
		return float32(math.NaN())
	}
	top := 1<<(7-mant) - 1
	e, m := int(bits>>mant)&top, int(bits)&(1<<mant-1)
	var mag float64
	switch {
	case dtype == FP8E5M2 && e == top && m == 0:
		mag = math.Inf(1)
	case (dtype == FP8E5M2 && e == top) || (dtype == FP8E4M3 && e == top && m == 1<<mant-1):
		mag = math.NaN()
	case e == 0:
		mag = math.Ldexp(float64(m), 1-bias-mant)
	default:
		mag = math.Ldexp(float64(1<<mant+m), e-bias-mant)
	}
	if bits&0x80 != 0 {
		mag = -mag
	}
	return float32(mag)
}

// Layout is an fd_kv_layout.
type Layout int32

const (
	TokenMajor Layout = C.FD_LAYOUT_TOKEN_MAJOR
	DimMajor   Layout = C.FD_LAYOUT_DIM_MAJOR
)

// RopeStyle is an fd_rope_style (docs/semantics.md S3.1): which dims of a
// head RoPE rotates together. Both use inv_freq[i] = rope_base^(-2i /
// rotary_dim) and leave the dims from rotary_dim on unchanged; a
// checkpoint's Q/K weights fix the style. The zero value is RopeSplitHalf.
type RopeStyle int32

const (
	// RopeSplitHalf pairs (i, i + rotary_dim/2), "rotate_half" (GPT-NeoX;
	// Llama, Mistral, Qwen, Gemma, Phi in Hugging Face layout). The default.
	RopeSplitHalf RopeStyle = C.FD_ROPE_SPLIT_HALF
	// RopeInterleaved pairs (2i, 2i + 1) (GPT-J, CodeGen, ChatGLM, Meta's
	// original Llama layout).
	RopeInterleaved RopeStyle = C.FD_ROPE_INTERLEAVED
)

// Elem is a Go type FlashDec can read: float32, uint16 bits of f16/bf16, or
// uint8 bits of FP8 (K/V only).
type Elem interface{ ~float32 | ~uint16 | ~uint8 }

func elemSize[T Elem]() int {
	var z T
	return int(unsafe.Sizeof(z))
}

// checkElem rejects a Go element type that cannot hold dtype (a value that
// is not an fd_dtype is left to the library).
func checkElem[T Elem](dtype DType, what string) error {
	if size := dtype.Size(); size != 0 && size != elemSize[T]() {
		return invalid("%s: Go element type does not match dtype %d (float32 for F32, uint16 bits for F16/BF16, uint8 bits for FP8)", what, dtype)
	}
	return nil
}

// elemCount multiplies dimension sizes, refusing a product that does not fit
// in an int (or a negative size): Go integer arithmetic wraps silently, and a
// wrapped count could match a short slice while C, given the real sizes,
// reads far past its end.
func elemCount(dims ...int) (int, bool) {
	n := 1
	for _, d := range dims {
		if d < 0 {
			return 0, false
		}
		if d != 0 && n > math.MaxInt/d {
			return 0, false
		}
		n *= d
	}
	return n, true
}

// fitsU32 reports whether a Go length can be passed as a C uint32_t
// without truncation.
func fitsU32(n int) bool { return n >= 0 && uint64(n) <= math.MaxUint32 }
