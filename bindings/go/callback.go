package chunkserve

// The stream callback, in its own file: cgo requires that the preamble of a file with //export
// holds declarations only (the C trampoline that calls this function is defined in stream.go).

/*
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

// chunkserveGoStreamEvent receives one event of a stream from libchunkserve (through
// chunkserve_go_stream_trampoline in stream.go). handle is the cgo.Handle of the stream's
// eventQueue, passed as the callback's user_data.
//
// It runs on the engine's step thread or the client's network thread (or, for events already
// queued when the callback was set, on the goroutine calling chunkserve_stream_set_callback), so
// it must return quickly and never block: it copies the event into Go memory, appends it to the
// queue under a short mutex and signals readers without waiting for them. The event and its
// error_message are valid only during this call. The library never overlaps invocations for one
// stream and never invokes it after chunkserve_stream_destroy returns, so the handle is valid here
// (Stream.Close deletes it only after destroy).
//
//export chunkserveGoStreamEvent
func chunkserveGoStreamEvent(handle C.uintptr_t, ev *C.chunkserve_stream_event_t) {
	q := cgo.Handle(handle).Value().(*eventQueue)
	if ev.kind == C.CHUNKSERVE_EVENT_TOKEN {
		e := Event{Kind: EventToken, Token: int32(ev.token), Index: int32(ev.index)}
		// A library older than 0.4 passes a version 1 event, without the logprobs fields.
		if uintptr(ev.struct_size) >= unsafe.Sizeof(*ev) && ev.num_top_logprobs >= 0 {
			n := int(ev.num_top_logprobs)
			if n > len(ev.top_tokens) {
				n = len(ev.top_tokens)
			}
			l := &Logprobs{Logprob: float32(ev.logprob), Top: make([]TopLogprob, n)}
			for i := 0; i < n; i++ {
				l.Top[i] = TopLogprob{Token: int32(ev.top_tokens[i]), Logprob: float32(ev.top_logprobs[i])}
			}
			e.Logprobs = l
		}
		q.push(e)
		return
	}
	f := &Finish{
		Reason:          FinishReason(ev.finish_reason),
		PromptTokens:    int32(ev.prompt_tokens),
		CachedTokens:    int32(ev.cached_tokens),
		GeneratedTokens: int32(ev.generated_tokens),
	}
	if ev.status != C.CHUNKSERVE_STATUS_OK {
		msg := ""
		if ev.error_message != nil {
			msg = C.GoString(ev.error_message)
		}
		f.Err = &Error{Code: Code(ev.status), Message: msg}
	}
	q.push(Event{Kind: EventFinished, Finish: f})
}
