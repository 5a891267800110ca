package chunkserve

/*
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"context"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// FinishReason says why a request ended; the values are the C ABI's CHUNKSERVE_FINISH_*.
type FinishReason int32

const (
	FinishStopToken   FinishReason = C.CHUNKSERVE_FINISH_STOP_TOKEN // a stop token was generated
	FinishLength      FinishReason = C.CHUNKSERVE_FINISH_LENGTH     // MaxNewTokens or the context
	FinishCancelled   FinishReason = C.CHUNKSERVE_FINISH_CANCELLED
	FinishDeadline    FinishReason = C.CHUNKSERVE_FINISH_DEADLINE
	FinishError       FinishReason = C.CHUNKSERVE_FINISH_ERROR
	FinishUnavailable FinishReason = C.CHUNKSERVE_FINISH_UNAVAILABLE // engine closed or shut down
)

// String returns the reason's name ("stop", "length", ...).
func (r FinishReason) String() string {
	return C.GoString(C.chunkserve_finish_reason_name(C.int32_t(r)))
}

// Finish is a request's terminal event.
type Finish struct {
	Reason          FinishReason
	PromptTokens    int32
	CachedTokens    int32 // prompt tokens whose KV came from the prefix cache
	GeneratedTokens int32
	// Err is the engine's error for FinishError and FinishUnavailable (an *Error), else nil.
	Err error
}

// EventKind tells a token from the terminal event.
type EventKind int32

const (
	EventToken    EventKind = C.CHUNKSERVE_EVENT_TOKEN
	EventFinished EventKind = C.CHUNKSERVE_EVENT_FINISHED
)

// Event is one element of a stream: a token, or the terminal event.
type Event struct {
	Kind   EventKind
	Token  int32   // EventToken: the generated token
	Index  int32   // EventToken: its 0-based position among the generated tokens
	Finish *Finish // EventFinished
}

// Stream is one request's output: generated tokens, then one terminal event. Safe for concurrent
// use. Consume it with Recv, Tokens or Collect, and Close it when done (Close cancels a request
// that is still running).
type Stream struct {
	mu  sync.RWMutex // read: calls into the stream; write: Close
	ptr *C.chunkserve_stream_t
	id  uint64
	ctx context.Context

	stop      chan struct{} // closed by Close
	closeOnce sync.Once

	done     chan struct{} // closed once the outcome (finish, err) is known
	doneOnce sync.Once
	finish   Finish
	err      error

	tokensOnce    sync.Once
	tokensStarted atomic.Bool
	tokens        chan int32
}

func newStream(ctx context.Context, ptr *C.chunkserve_stream_t) *Stream {
	s := &Stream{
		ptr:  ptr,
		id:   uint64(C.chunkserve_stream_id(ptr)),
		ctx:  ctx,
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if ctx.Done() != nil {
		go s.watch()
	}
	runtime.SetFinalizer(s, (*Stream).Close)
	return s
}

// watch cancels the request when the context is done first.
func (s *Stream) watch() {
	select {
	case <-s.ctx.Done():
		_ = s.Cancel()
	case <-s.done:
	case <-s.stop:
	}
}

// ID is the request id, for Engine.Cancel.
func (s *Stream) ID() uint64 { return s.id }

// Cancel asks the engine to cancel the request; the terminal event still arrives. It is a no-op
// once the request has finished.
func (s *Stream) Cancel() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ptr == nil {
		return ErrClosed
	}
	var cerr *C.chunkserve_error_t
	return fromC(C.chunkserve_stream_cancel(s.ptr, &cerr), cerr)
}

// Recv blocks until the next event. After the terminal event it returns io.EOF; after Close,
// ErrClosed. Several goroutines may call it; each event goes to one of them.
func (s *Stream) Recv() (Event, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.ptr == nil {
		return Event{}, ErrClosed
	}
	var ev C.chunkserve_stream_event_t
	ev.struct_size = C.uint32_t(unsafe.Sizeof(ev))
	var cerr *C.chunkserve_error_t
	st := C.chunkserve_stream_next(s.ptr, C.CHUNKSERVE_WAIT_FOREVER, &ev, &cerr)
	if st == C.CHUNKSERVE_STATUS_OUT_OF_RANGE {
		C.chunkserve_error_free(cerr)
		return Event{}, io.EOF
	}
	if st != C.CHUNKSERVE_STATUS_OK {
		err := fromC(st, cerr)
		s.settle(Finish{}, err)
		return Event{}, err
	}
	if ev.kind == C.CHUNKSERVE_EVENT_TOKEN {
		return Event{Kind: EventToken, Token: int32(ev.token), Index: int32(ev.index)}, nil
	}
	f := Finish{
		Reason:          FinishReason(ev.finish_reason),
		PromptTokens:    int32(ev.prompt_tokens),
		CachedTokens:    int32(ev.cached_tokens),
		GeneratedTokens: int32(ev.generated_tokens),
	}
	if ev.status != C.CHUNKSERVE_STATUS_OK {
		f.Err = &Error{Code: Code(ev.status), Message: C.GoString(ev.error_message)}
	}
	s.settle(f, s.outcomeErr(f))
	return Event{Kind: EventFinished, Finish: &f}, nil
}

// outcomeErr is the error Finish and Collect report for a terminal event: nil for a normal end,
// the context's error when the context ended the request, else an *Error with the code.
func (s *Stream) outcomeErr(f Finish) error {
	switch f.Reason {
	case FinishStopToken, FinishLength:
		return nil
	case FinishCancelled:
		if err := s.ctx.Err(); err != nil {
			return err
		}
		return &Error{Code: Cancelled, Message: "request cancelled"}
	case FinishDeadline:
		if err := s.ctx.Err(); err != nil {
			return err
		}
		return &Error{Code: DeadlineExceeded, Message: "request deadline passed"}
	default:
		if f.Err != nil {
			return f.Err
		}
		return &Error{Code: Internal, Message: "request failed: " + f.Reason.String()}
	}
}

func (s *Stream) settle(f Finish, err error) {
	s.doneOnce.Do(func() {
		s.finish = f
		s.err = err
		close(s.done)
	})
}

// Tokens returns a channel of the generated tokens, closed after the last one. Call Finish for
// the outcome afterwards. The channel is fed by a goroutine that stops when the stream ends or is
// closed, so a reader may stop early by closing the stream (or cancelling its context).
func (s *Stream) Tokens() <-chan int32 {
	s.tokensOnce.Do(func() {
		s.tokens = make(chan int32, 16)
		s.tokensStarted.Store(true)
		go func() {
			defer close(s.tokens)
			for {
				ev, err := s.Recv()
				if err != nil || ev.Kind == EventFinished {
					return
				}
				select {
				case s.tokens <- ev.Token:
				case <-s.stop:
					return
				}
			}
		}()
	})
	return s.tokens
}

// Finish waits for the terminal event and returns it. The error is nil when the request ended
// normally (stop token or length), the context's error when ctx ended it, an *Error otherwise
// (ErrCancelled, ErrDeadlineExceeded, ErrUnavailable, ...). Tokens not yet received are
// discarded, unless Tokens is delivering them.
func (s *Stream) Finish() (Finish, error) {
	for {
		select {
		case <-s.done:
			return s.finish, s.err
		default:
		}
		if s.tokensStarted.Load() {
			select {
			case <-s.done:
				return s.finish, s.err
			case <-s.stop:
				return Finish{}, ErrClosed
			}
		}
		if _, err := s.Recv(); err != nil && err != io.EOF {
			return Finish{}, err
		}
	}
}

// Collect receives every remaining token and the terminal event; the error is Finish's.
func (s *Stream) Collect() ([]int32, Finish, error) {
	var tokens []int32
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			return tokens, s.finish, s.err
		}
		if err != nil {
			return tokens, Finish{}, err
		}
		if ev.Kind == EventToken {
			tokens = append(tokens, ev.Token)
			continue
		}
		return tokens, *ev.Finish, s.outcomeErr(*ev.Finish)
	}
}

// Close cancels the request if it is still running and frees the stream. It waits for a Recv in
// progress to return (which the cancellation makes prompt) and is idempotent.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		s.mu.RLock()
		if s.ptr != nil {
			C.chunkserve_stream_cancel(s.ptr, nil)
		}
		s.mu.RUnlock()
		s.mu.Lock()
		C.chunkserve_stream_destroy(s.ptr)
		s.ptr = nil
		s.mu.Unlock()
		runtime.SetFinalizer(s, nil)
		s.settle(Finish{}, ErrClosed)
	})
	return nil
}
