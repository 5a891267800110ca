package chunkserve

/*
#include <stdlib.h>
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

// Text: the served model's tokenizer, chat template and end-of-answer ids (C ABI 0.3). The engine
// loads them from its ModelPath on the first such call; an engine without tokenizer files fails
// each call with ErrFailedPrecondition (the built-in tiny model) or ErrNotFound (a model folder
// without tokenizer.json), and the message says what is missing.

// ChatMessage is one turn of a conversation for ApplyChatTemplate.
type ChatMessage struct {
	Role    string // "system", "user" or "assistant"
	Content string
}

// callSized runs a C function that fills a buffer under the ABI's sizing contract: it reports
// the whole result's size and returns OUT_OF_RANGE when the buffer is too small. It is called
// with a buffer of `guess` elements first and, if that is too small, once more with the size it
// asked for. The result is the number of elements written.
func callSized[T any](guess int, call func(buf *T, capacity C.size_t, size *C.size_t,
	cerr **C.chunkserve_error_t) C.chunkserve_status_t) ([]T, error) {
	buf := make([]T, guess+1) // never empty: &buf[0] is valid
	for attempt := 0; ; attempt++ {
		var size C.size_t
		var cerr *C.chunkserve_error_t
		st := call(&buf[0], C.size_t(len(buf)), &size, &cerr)
		if st == C.CHUNKSERVE_STATUS_OUT_OF_RANGE && attempt == 0 && int(size) > len(buf) {
			C.chunkserve_error_free(cerr)
			buf = make([]T, int(size)+1)
			continue
		}
		if st != C.CHUNKSERVE_STATUS_OK {
			return nil, fromC(st, cerr)
		}
		return buf[:int(size)], nil
	}
}

func cBool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

// Tokenize encodes UTF-8 text into the model's token ids. Special tokens written in the text
// ("<|im_start|>") become their ids; addSpecial adds what the tokenizer adds around a text (a BOS
// token for Llama-style vocabularies). Errors: ErrInvalidArgument (text that is not valid UTF-8),
// ErrFailedPrecondition / ErrNotFound (no tokenizer), ErrClosed.
func (e *Engine) Tokenize(text string, addSpecial bool) ([]int32, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return nil, ErrClosed
	}
	bytes := []byte(text) // a Go byte slice holds no Go pointers: C may read it during the call
	var ptr *C.char
	if len(bytes) > 0 {
		ptr = (*C.char)(unsafe.Pointer(&bytes[0]))
	}
	// A token covers at least one byte, plus a few the tokenizer may add.
	ids, err := callSized(len(bytes)+4, func(buf *int32, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_tokenize(e.ptr, ptr, C.size_t(len(bytes)), cBool(addSpecial),
			(*C.int32_t)(unsafe.Pointer(buf)), capacity, size, cerr)
	})
	runtime.KeepAlive(bytes)
	return ids, err
}

// Detokenize decodes token ids into text (always valid UTF-8); skipSpecial leaves out special
// tokens such as <|im_end|>. Errors: ErrInvalidArgument (an id outside the vocabulary),
// ErrFailedPrecondition / ErrNotFound (no tokenizer), ErrClosed.
func (e *Engine) Detokenize(ids []int32, skipSpecial bool) (string, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return "", ErrClosed
	}
	var ptr *C.int32_t
	if len(ids) > 0 {
		ptr = (*C.int32_t)(unsafe.Pointer(&ids[0]))
	}
	text, err := callSized(8*len(ids)+16, func(buf *byte, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_detokenize(e.ptr, ptr, C.size_t(len(ids)), cBool(skipSpecial),
			(*C.char)(unsafe.Pointer(buf)), capacity, size, cerr)
	})
	runtime.KeepAlive(ids)
	return string(text), err
}

// ApplyChatTemplate renders a conversation with the model's chat template, as transformers'
// apply_chat_template does; addGenerationPrompt appends the start of an assistant turn. Tokenize
// the result with addSpecial false (it already holds the special tokens as text). Errors:
// ErrInvalidArgument (a conversation the template refuses), ErrFailedPrecondition (no chat
// template, or no tokenizer), ErrNotFound, ErrUnimplemented (a template family chunkserve does not
// render), ErrClosed.
func (e *Engine) ApplyChatTemplate(msgs []ChatMessage, addGenerationPrompt bool) (string, error) {
	// Strings go to C memory: a Go array of pointers to Go memory may not be passed to C.
	n := len(msgs)
	var roles, contents **C.char
	guess := 256
	if n > 0 {
		size := C.size_t(n) * C.size_t(unsafe.Sizeof((*C.char)(nil)))
		roles = (**C.char)(C.malloc(size))
		contents = (**C.char)(C.malloc(size))
		defer C.free(unsafe.Pointer(roles))
		defer C.free(unsafe.Pointer(contents))
		rs := unsafe.Slice(roles, n)
		cs := unsafe.Slice(contents, n)
		for i, m := range msgs {
			rs[i] = C.CString(m.Role)
			cs[i] = C.CString(m.Content)
			defer C.free(unsafe.Pointer(rs[i]))
			defer C.free(unsafe.Pointer(cs[i]))
			guess += len(m.Role) + len(m.Content) + 32
		}
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return "", ErrClosed
	}
	text, err := callSized(guess, func(buf *byte, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_apply_chat_template(e.ptr, roles, contents, C.size_t(n),
			cBool(addGenerationPrompt), (*C.char)(unsafe.Pointer(buf)), capacity, size, cerr)
	})
	return string(text), err
}

// EOSIDs returns the ids that end an answer (the model's EOS token and its chat template's
// end-of-turn token), sorted: use them as Request.StopTokens. Errors: ErrFailedPrecondition /
// ErrNotFound (no tokenizer), ErrClosed.
func (e *Engine) EOSIDs() ([]int32, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return nil, ErrClosed
	}
	return callSized(8, func(buf *int32, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_engine_eos_ids(e.ptr, (*C.int32_t)(unsafe.Pointer(buf)), capacity,
			size, cerr)
	})
}

// Detokenizer turns the ids of one generated sequence into text as they arrive: every piece is
// valid UTF-8 (the bytes of a character split over several tokens are held back until it is
// complete), and the pieces of all Push calls and the final Flush add up to Detokenize of all the
// ids. It keeps the engine's tokenizer itself, so it may outlive the engine. Safe for concurrent
// use (calls are serialized); Close is idempotent.
type Detokenizer struct {
	mu  sync.Mutex
	ptr *C.chunkserve_detokenizer_t
}

// NewDetokenizer creates a streaming detokenizer over the engine's tokenizer; skipSpecial leaves
// special tokens out of the text. Errors: ErrFailedPrecondition / ErrNotFound (no tokenizer),
// ErrClosed.
func (e *Engine) NewDetokenizer(skipSpecial bool) (*Detokenizer, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return nil, ErrClosed
	}
	var ptr *C.chunkserve_detokenizer_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_detokenizer_create(e.ptr, cBool(skipSpecial), &ptr, &cerr); st != 0 {
		return nil, fromC(st, cerr)
	}
	d := &Detokenizer{ptr: ptr}
	// A safety net only: an unreachable detokenizer is freed, but Close should be called.
	runtime.SetFinalizer(d, (*Detokenizer).Close)
	return d, nil
}

// Push adds one id and returns the text it completes (possibly ""). An id that is refused
// (ErrInvalidArgument: outside the vocabulary) is not taken.
func (d *Detokenizer) Push(id int32) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return "", ErrClosed
	}
	// A refused push leaves the C detokenizer unchanged, so the retry with a bigger buffer is
	// the same push.
	text, err := callSized(64, func(buf *byte, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_detokenizer_push(d.ptr, C.int32_t(id),
			(*C.char)(unsafe.Pointer(buf)), capacity, size, cerr)
	})
	return string(text), err
}

// Flush returns the text still held back (bytes of an unfinished character become U+FFFD) and
// empties the detokenizer, which may then start a new sequence.
func (d *Detokenizer) Flush() (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr == nil {
		return "", ErrClosed
	}
	text, err := callSized(64, func(buf *byte, capacity C.size_t, size *C.size_t,
		cerr **C.chunkserve_error_t) C.chunkserve_status_t {
		return C.chunkserve_detokenizer_flush(d.ptr, (*C.char)(unsafe.Pointer(buf)), capacity,
			size, cerr)
	})
	return string(text), err
}

// Close frees the detokenizer; idempotent.
func (d *Detokenizer) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ptr != nil {
		C.chunkserve_detokenizer_destroy(d.ptr)
		d.ptr = nil
		runtime.SetFinalizer(d, nil)
	}
}
