package chunkserve

/*
#include <stdint.h>
#include <chunkserve/chunkserve.h>

// Defined in callback.go (//export).
extern void chunkserveGoStreamEvent(uintptr_t handle, chunkserve_stream_event_t* event);

// The C callback registered on every stream: user_data carries the cgo.Handle of the stream's
// event queue as an integer (never a Go pointer, which C may not keep).
static void chunkserve_go_stream_trampoline(const chunkserve_stream_event_t* event,
                                            void* user_data) {
  chunkserveGoStreamEvent((uintptr_t)user_data, (chunkserve_stream_event_t*)event);
}

static chunkserve_status_t chunkserve_go_set_callback(chunkserve_stream_t* stream,
                                                      uintptr_t handle,
                                                      chunkserve_error_t** out_error) {
  return chunkserve_stream_set_callback(stream, chunkserve_go_stream_trampoline,
                                        (void*)handle, out_error);
}
*/
import "C"

import (
	"context"
	"io"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"
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
	Kind     EventKind
	Token    int32     // EventToken: the generated token
	Index    int32     // EventToken: its 0-based position among the generated tokens
	Logprobs *Logprobs // EventToken of a request with Logprobs set; else nil
	Finish   *Finish   // EventFinished
}

// Logprobs are a generated token's log-probabilities under the model's own distribution
// softmax(logits), before temperature and top-k / top-p; math.Inf(-1) for probability 0.
type Logprobs struct {
	Logprob float32      // of the generated token
	Top     []TopLogprob // the most likely tokens, most likely first
}

// TopLogprob is one of the most likely tokens at a position.
type TopLogprob struct {
	Token   int32
	Logprob float32
}

// eventQueue holds a stream's events between the library's callback, which appends them, and the
// goroutines that receive them. It is what the stream's cgo.Handle refers to (not the Stream, so
// that an unreachable Stream can still be finalized).
//
// It is unbounded on purpose: the callback runs on the engine's step thread (or the client's
// network thread), which serves every stream, so it may never wait for a slow or absent reader;
// dropping or reordering events is not an option either. The growth is bounded by the request
// itself: at most MaxNewTokens tokens (no more than the model's context) and one terminal event,
// which is what libchunkserve's own queue holds for chunkserve_stream_next when nobody reads. The
// memory is freed when the events are received or the stream is closed.
type eventQueue struct {
	mu     sync.Mutex
	events []Event // events[head:] are delivered and not yet received
	head   int
	final  Finish // the terminal event, once arrived
	// arrived: the terminal event was delivered (ended is closed); taken: it was received
	// (drained is closed, and Recv returns io.EOF from then on).
	arrived, taken bool
	// ready holds a token whenever events may be waiting: push adds one, and a receiver that
	// leaves events behind passes it on. One token (capacity 1) wakes one waiting receiver.
	ready   chan struct{}
	ended   chan struct{}
	drained chan struct{}
}

func newEventQueue() *eventQueue {
	return &eventQueue{
		ready:   make(chan struct{}, 1),
		ended:   make(chan struct{}),
		drained: make(chan struct{}),
	}
}

// push appends an event; called by the stream callback only (invocations never overlap). It
// never blocks beyond the short critical section.
func (q *eventQueue) push(ev Event) {
	q.mu.Lock()
	if q.arrived { // the library sends exactly one terminal event; nothing follows it
		q.mu.Unlock()
		return
	}
	q.events = append(q.events, ev)
	if ev.Kind == EventFinished {
		q.arrived = true
		q.final = *ev.Finish
		close(q.ended)
	}
	q.mu.Unlock()
	q.signal()
}

// signal leaves a wake-up token for one receiver unless one is already waiting there.
func (q *eventQueue) signal() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// Stream is one request's output: generated tokens, then one terminal event. Safe for concurrent
// use. Consume it with Recv, Tokens or Collect, and Close it when done (Close cancels a request
// that is still running).
//
// The library delivers the events through a stream callback (chunkserve_stream_set_callback) into
// a queue in Go memory, so a goroutine waiting in Recv, Finish, Collect or on the Tokens channel
// is parked by the Go scheduler and holds no OS thread: thousands of waiting streams cost
// goroutines, not threads. The queue never drops or reorders events and never makes the library's
// thread wait; a stream that nobody reads keeps its undelivered tokens (at most MaxNewTokens)
// until they are received or the stream is closed.
type Stream struct {
	mu     sync.RWMutex // read: calls into the C stream; write: Close (destroy overlaps no call)
	ptr    *C.chunkserve_stream_t
	handle cgo.Handle // refers to q; deleted by Close once the callback can no longer run
	q      *eventQueue
	id     uint64
	ctx    context.Context

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

// newStream takes ownership of ptr (a stream just returned by submit): it registers the callback
// that feeds the stream's queue, and on failure destroys ptr and returns the error.
func newStream(ctx context.Context, ptr *C.chunkserve_stream_t) (*Stream, error) {
	q := newEventQueue()
	h := cgo.NewHandle(q)
	// Events already queued in the library are delivered on this goroutine before this returns;
	// later ones on the library's thread.
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_go_set_callback(ptr, C.uintptr_t(h), &cerr); st != C.CHUNKSERVE_STATUS_OK {
		C.chunkserve_stream_destroy(ptr) // waits for a running invocation; none after
		h.Delete()
		return nil, fromC(st, cerr)
	}
	s := &Stream{
		ptr:    ptr,
		handle: h,
		q:      q,
		id:     uint64(C.chunkserve_stream_id(ptr)),
		ctx:    ctx,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	if ctx.Done() != nil {
		go s.watch()
	}
	// A safety net only: an unreachable stream is closed, but Close should be called.
	runtime.SetFinalizer(s, (*Stream).Close)
	return s, nil
}

// watch cancels the request when the context is done before the terminal event arrives.
func (s *Stream) watch() {
	select {
	case <-s.ctx.Done():
		_ = s.Cancel()
	case <-s.q.ended:
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

// Recv waits for the next event and returns it. After the terminal event it returns io.EOF; after
// Close, ErrClosed (a Recv waiting when Close is called returns ErrClosed at once). Several
// goroutines may call it; each event goes to one of them, in order. A waiting Recv is a parked
// goroutine, not a thread blocked in C. It takes no context: when the stream's context is done the
// request is cancelled, and the terminal event (FinishCancelled or FinishDeadline) ends the wait.
func (s *Stream) Recv() (Event, error) {
	q := s.q
	for {
		select {
		case <-s.stop:
			return Event{}, ErrClosed
		default:
		}
		q.mu.Lock()
		if q.head < len(q.events) {
			ev := q.events[q.head]
			q.events[q.head] = Event{}
			q.head++
			if q.head == len(q.events) { // empty: reuse the array
				q.events = q.events[:0]
				q.head = 0
			}
			more := q.head < len(q.events)
			if ev.Kind == EventFinished {
				// Settled before Recv can return io.EOF anywhere, so that io.EOF implies a known
				// outcome.
				q.taken = true
				s.settle(*ev.Finish, s.outcomeErr(*ev.Finish))
				close(q.drained)
			}
			q.mu.Unlock()
			if more {
				q.signal() // pass the wake-up on to another receiver
			}
			return ev, nil
		}
		taken := q.taken
		q.mu.Unlock()
		if taken {
			return Event{}, io.EOF
		}
		select {
		case <-q.ready:
		case <-q.drained:
		case <-s.stop:
			return Event{}, ErrClosed
		}
	}
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

// Tokens returns a channel of the generated tokens, closed after the last one. The channel does
// not carry the outcome: once it is closed, Err (or Finish) returns the error that ended the
// stream, nil for a normal end (stop token or length):
//
//	for tok := range stream.Tokens() { ... }
//	if err := stream.Err(); err != nil { ... } // ctx.Err(), ErrUnavailable, ErrClosed, ...
//
// The channel is fed by a goroutine (parked, like every waiting reader) that stops when the
// stream ends or is closed, so a reader may stop early by closing the stream (or cancelling its
// context); the channel is then closed and Err returns ErrClosed (or the context's error).
// Calling Tokens again returns the same channel.
func (s *Stream) Tokens() <-chan int32 {
	s.tokensOnce.Do(func() {
		s.tokens = make(chan int32, 16)
		s.tokensStarted.Store(true)
		go func() {
			defer close(s.tokens)
			for {
				// Every way out settles the outcome first: the terminal event (or io.EOF after
				// another receiver took it) settles it in Recv, Close settles ErrClosed before
				// closing stop. So Err is final once the channel is closed.
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

// Err returns the error that ended the stream, once its outcome is known: nil when it ended
// normally (stop token or length), the context's error when the context ended it, an *Error
// otherwise (ErrCancelled, ErrDeadlineExceeded, ErrUnavailable, a FinishError's code, ...), and
// ErrClosed after Close. It does not wait: it returns nil while the outcome is unknown, so call
// it after the Tokens channel is closed (or after Recv returned the terminal event or io.EOF).
// It equals the error Finish returns.
func (s *Stream) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Finish waits for the terminal event and returns it. The error is nil when the request ended
// normally (stop token or length), the context's error when ctx ended it, an *Error otherwise
// (ErrCancelled, ErrDeadlineExceeded, ErrUnavailable, ...), ErrClosed after Close. Tokens not yet
// received are discarded, unless Tokens is in use: then Finish returns as soon as the terminal
// event has arrived and leaves every token to the Tokens channel.
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
			case <-s.q.ended:
				s.q.mu.Lock()
				f := s.q.final
				s.q.mu.Unlock()
				s.settle(f, s.outcomeErr(f))
			case <-s.stop:
				return Finish{}, ErrClosed
			}
			return s.finish, s.err
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
		if err == io.EOF { // another receiver took the terminal event; the outcome is settled
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

// Close cancels the request if it is still running and frees the stream; it is idempotent.
// Receivers waiting in Recv, Finish or Collect return ErrClosed at once, and the Tokens channel
// is closed. Close waits only for a callback invocation in progress on the library's thread (a
// few microseconds): chunkserve_stream_destroy guarantees none runs afterwards, and only then is
// the stream's cgo.Handle deleted.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.settle(Finish{}, ErrClosed) // before stop, so that every reader woken by it sees it
		close(s.stop)
		s.mu.Lock()
		C.chunkserve_stream_destroy(s.ptr) // cancels a running request
		s.ptr = nil
		s.mu.Unlock()
		s.handle.Delete()
		runtime.SetFinalizer(s, nil)
	})
	return nil
}
