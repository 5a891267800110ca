// Package chunkserve embeds the chunkserve LLM serving engine in a Go program through its stable
// C ABI (libchunkserve.so, header <chunkserve/chunkserve.h>).
//
//	engine, err := chunkserve.NewEngine(chunkserve.EngineOptions{ModelPath: path, KVCacheBytes: 64 << 20})
//	if err != nil { ... }
//	defer engine.Close()
//	stream, err := engine.Submit(ctx, chunkserve.Request{Prompt: tokens, MaxNewTokens: 32})
//	if err != nil { ... }
//	defer stream.Close()
//	for tok := range stream.Tokens() { ... }
//	finish, err := stream.Finish() // or stream.Err(): nil, ctx.Err(), or an *Error
//
// Streams receive their events through the library's stream callback into Go memory, so a
// goroutine waiting for tokens is parked by the Go scheduler and holds no OS thread, however many
// streams wait. NewEngineContext and DialContext take a context that bounds creating the engine
// or connecting.
//
// An empty EngineOptions.ModelPath serves the built-in tiny random-weight model (vocab 1024).
//
// Building: cgo finds the header and the library through pkg-config (`#cgo pkg-config:
// chunkserve`, in link_pkgconfig.go), so an installed library needs nothing, or only
// PKG_CONFIG_PATH for a prefix pkg-config does not search by default:
//
//	cmake --install <build> --prefix <prefix>
//	PKG_CONFIG_PATH=<prefix>/lib/pkgconfig go test ./...
//
// The installed chunkserve.pc carries an rpath to its lib directory, so the programs run without
// LD_LIBRARY_PATH. A build tree, not installed, is used the same way through its
// chunkserve-uninstalled.pc, which pkg-config prefers: PKG_CONFIG_PATH=<build>/lib/pkgconfig.
// Without pkg-config, build with -tags chunkserve_no_pkgconfig (which links plain -lchunkserve)
// and give the paths in the usual variables, e.g.
//
//	CGO_CFLAGS="-I<src>/capi/include" CGO_LDFLAGS="-L<build>/lib -Wl,-rpath,<build>/lib"
//
// Errors returned by the engine are *Error values carrying a Code; compare them with errors.Is
// against the Err* sentinels (errors.Is(err, chunkserve.ErrInvalidArgument)) or extract them with
// errors.As. Every type is safe for concurrent use; Close methods are idempotent.
package chunkserve

/*
#include <stdlib.h>
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Version returns the library's release ("MAJOR.MINOR.PATCH").
func Version() string { return C.GoString(C.chunkserve_version()) }

// ABIVersion returns the library's ABI generation; it equals HeaderABIVersion unless the program
// runs against an incompatible library.
func ABIVersion() int { return int(C.chunkserve_abi_version()) }

// HeaderABIVersion is the ABI generation of the header this package was compiled against.
const HeaderABIVersion = int(C.CHUNKSERVE_ABI_VERSION)

// Code is a chunkserve status code; the values are the C ABI's CHUNKSERVE_STATUS_*.
type Code int32

// Status codes.
const (
	OK                 Code = C.CHUNKSERVE_STATUS_OK
	InvalidArgument    Code = C.CHUNKSERVE_STATUS_INVALID_ARGUMENT
	NotFound           Code = C.CHUNKSERVE_STATUS_NOT_FOUND
	AlreadyExists      Code = C.CHUNKSERVE_STATUS_ALREADY_EXISTS
	ResourceExhausted  Code = C.CHUNKSERVE_STATUS_RESOURCE_EXHAUSTED
	FailedPrecondition Code = C.CHUNKSERVE_STATUS_FAILED_PRECONDITION
	OutOfRange         Code = C.CHUNKSERVE_STATUS_OUT_OF_RANGE
	Unavailable        Code = C.CHUNKSERVE_STATUS_UNAVAILABLE
	DeadlineExceeded   Code = C.CHUNKSERVE_STATUS_DEADLINE_EXCEEDED
	Cancelled          Code = C.CHUNKSERVE_STATUS_CANCELLED
	Internal           Code = C.CHUNKSERVE_STATUS_INTERNAL
	Unimplemented      Code = C.CHUNKSERVE_STATUS_UNIMPLEMENTED
	DataLoss           Code = C.CHUNKSERVE_STATUS_DATA_LOSS
	Aborted            Code = C.CHUNKSERVE_STATUS_ABORTED
	Unauthenticated    Code = C.CHUNKSERVE_STATUS_UNAUTHENTICATED
)

// String returns the code's stable name, e.g. "INVALID_ARGUMENT".
func (c Code) String() string { return C.GoString(C.chunkserve_status_name(C.chunkserve_status_t(c))) }

// Error is an error reported by libchunkserve: a code and a message.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "chunkserve: " + e.Code.String()
	}
	return fmt.Sprintf("chunkserve: %s: %s", e.Code, e.Message)
}

// Is reports whether target is an *Error with the same code and, when target has a message, the
// same message. So errors.Is(err, ErrNotFound) matches any NOT_FOUND error.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// Sentinels for errors.Is; they match any *Error with their code.
var (
	ErrInvalidArgument    = &Error{Code: InvalidArgument}
	ErrNotFound           = &Error{Code: NotFound}
	ErrResourceExhausted  = &Error{Code: ResourceExhausted}
	ErrFailedPrecondition = &Error{Code: FailedPrecondition}
	ErrUnavailable        = &Error{Code: Unavailable}
	ErrDeadlineExceeded   = &Error{Code: DeadlineExceeded}
	ErrCancelled          = &Error{Code: Cancelled}
	ErrInternal           = &Error{Code: Internal}
	ErrUnimplemented      = &Error{Code: Unimplemented}
	ErrDataLoss           = &Error{Code: DataLoss}
)

// ErrClosed is returned by methods called on an Engine or Stream after Close.
var ErrClosed = errors.New("chunkserve: use of a closed handle")

// CodeOf returns the Code of err: OK for nil, the code of an *Error in its chain, and Internal
// for any other error.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Internal
}

// fromC turns a status and the C error object into a Go error, freeing the object.
func fromC(status C.chunkserve_status_t, cerr *C.chunkserve_error_t) error {
	if cerr != nil {
		defer C.chunkserve_error_free(cerr)
	}
	if status == C.CHUNKSERVE_STATUS_OK {
		return nil
	}
	msg := ""
	if cerr != nil {
		msg = C.GoString(C.chunkserve_error_message(cerr))
	}
	return &Error{Code: Code(status), Message: msg}
}

// ctxError is the error of a constructor that ctx ended: it wraps ctxErr (context.Canceled or
// context.DeadlineExceeded, for errors.Is) and names the operation and, when the library failed
// too, its error.
func ctxError(op string, ctxErr, cause error) error {
	if cause != nil {
		return fmt.Errorf("chunkserve: %s: %w (%v)", op, ctxErr, cause)
	}
	return fmt.Errorf("chunkserve: %s: %w", op, ctxErr)
}

// ctxDoneErr is ctx.Err(), or context.DeadlineExceeded once ctx's deadline has passed even if
// its timer has not fired yet.
func ctxDoneErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline, ok := ctx.Deadline(); ok && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// testHooks lets tests observe createWithContext; read once per call by the calling goroutine
// (so tests set it before the call, from the test goroutine). created runs after a successful
// create, before the result is handed over; abandoned runs after an object created for a caller
// that had already returned was destroyed.
var testHooks struct{ created, abandoned func() }

// created is createWithContext's result.
type created[T any] struct {
	v   T
	err error
}

// createWithContext runs create (a blocking C constructor that cannot be interrupted) and returns
// its result, unless ctx is done first: then it returns ctxError(op, ctx.Err()) at once, and the
// object, if create still succeeds, is passed to destroy in the background, so it never leaks.
// With a ctx that can never be done, create runs on the calling goroutine.
func createWithContext[T any](ctx context.Context, op string, create func() (T, error),
	destroy func(T)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, ctxError(op, err, nil)
	}
	if ctx.Done() == nil {
		return create()
	}
	hooks := testHooks
	results := make(chan created[T]) // unbuffered: a send succeeds only while the caller waits
	abandon := make(chan struct{})
	go func() {
		v, err := create()
		if err == nil && hooks.created != nil {
			hooks.created()
		}
		select {
		case results <- created[T]{v, err}:
		case <-abandon:
			if err == nil {
				destroy(v)
			}
			if hooks.abandoned != nil {
				hooks.abandoned()
			}
		}
	}()
	select {
	case r := <-results:
		if r.err != nil {
			if err := ctxDoneErr(ctx); err != nil { // the library gave up because ctx did
				return zero, ctxError(op, err, r.err)
			}
		}
		return r.v, r.err
	case <-ctx.Done():
		close(abandon)
		return zero, ctxError(op, ctx.Err(), nil)
	}
}
