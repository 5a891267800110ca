package chunkserve

/*
#include <stdlib.h>
#include <string.h>
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Backend selects where the engine computes.
type Backend int32

const (
	BackendCPU  Backend = C.CHUNKSERVE_BACKEND_CPU
	BackendCUDA Backend = C.CHUNKSERVE_BACKEND_CUDA
)

// DType is the element type of the KV cache.
type DType int32

const (
	DTypeF32  DType = C.CHUNKSERVE_DTYPE_F32
	DTypeF16  DType = C.CHUNKSERVE_DTYPE_F16
	DTypeBF16 DType = C.CHUNKSERVE_DTYPE_BF16
)

// ShutdownMode says what Shutdown does with requests in flight.
type ShutdownMode int32

const (
	// ShutdownDrain stops admitting and finishes every submitted request.
	ShutdownDrain ShutdownMode = C.CHUNKSERVE_SHUTDOWN_DRAIN
	// ShutdownAbort ends every request now with FinishUnavailable.
	ShutdownAbort ShutdownMode = C.CHUNKSERVE_SHUTDOWN_ABORT
)

// EngineOptions configures NewEngine. The zero value means the defaults (and the built-in tiny
// model).
type EngineOptions struct {
	// ModelPath is a directory with config.json and safetensors weights, or a .gguf file;
	// required unless TinyModel.
	ModelPath string
	// TinyModel serves the built-in tiny random-weight model (vocab 1024; tests, demos) instead
	// of ModelPath, which must then be "". Random weights are never a silent fallback.
	TinyModel bool
	Backend   Backend
	// KVCacheBytes is the KV cache size; 0: 256 MiB.
	KVCacheBytes uint64
	// ChunkSize is the number of tokens per KV chunk (16..256); 0: 64.
	ChunkSize int32
	KVDType   DType
	// GGUFDType is what a .gguf model's tensors are dequantized to (default F32); the CPU
	// backend keeps F16 / BF16 weights half-size. Ignored for safetensors. Needs 0.5.
	GGUFDType DType
	// DisablePrefixSharing turns off reuse of cached prompt prefixes.
	DisablePrefixSharing bool
	// NumThreads is the number of CPU backend threads; 0: hardware concurrency.
	NumThreads int32
	// MaxBatchSize is the number of sequences per step; 0: 64.
	MaxBatchSize int32
	// PrefillTokenBudget is the number of tokens per step; 0: 512; negative: unlimited.
	PrefillTokenBudget int32
	// MaxQueuedRequests bounds the queue (Submit fails with ResourceExhausted beyond it); 0: 4096.
	MaxQueuedRequests int32
}

// Engine is an in-process chunkserve engine. Safe for concurrent use. Close it when done; streams
// it created stay valid (they end with FinishUnavailable) and must be closed too.
type Engine struct {
	mu  sync.RWMutex // read: calls into the engine; write: Close
	ptr *C.chunkserve_engine_t
}

// NewEngine creates an engine and starts its step thread: NewEngineContext with
// context.Background().
func NewEngine(opts EngineOptions) (*Engine, error) {
	return NewEngineContext(context.Background(), opts)
}

// NewEngineContext creates an engine and starts its step thread. Creating blocks while the model
// loads (milliseconds for the built-in tiny model, longer for a large model directory) and cannot
// be interrupted inside the library, so when ctx is done first NewEngineContext returns at once
// with an error wrapping ctx.Err() (errors.Is(err, context.Canceled) or
// context.DeadlineExceeded), and the engine, should the load still succeed, is destroyed in the
// background: it never leaks. A ctx that is already done returns that error without loading
// anything. Other errors are *Error values: ErrInvalidArgument (bad options), ErrNotFound or
// ErrDataLoss (model files), ErrUnimplemented (backend), ErrUnavailable (I/O),
// ErrResourceExhausted.
func NewEngineContext(ctx context.Context, opts EngineOptions) (*Engine, error) {
	if err := ctx.Err(); err != nil {
		return nil, ctxError("NewEngine", err, nil)
	}
	var o C.chunkserve_engine_options_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_engine_options_init(&o, C.uint32_t(unsafe.Sizeof(o)), &cerr); st != 0 {
		return nil, fromC(st, cerr)
	}
	o.backend = C.int32_t(opts.Backend)
	o.kv_cache_bytes = C.uint64_t(opts.KVCacheBytes)
	o.chunk_size = C.int32_t(opts.ChunkSize)
	o.kv_dtype = C.int32_t(opts.KVDType)
	o.gguf_dtype = C.int32_t(opts.GGUFDType)
	if opts.DisablePrefixSharing {
		o.enable_prefix_sharing = 0
	}
	o.num_threads = C.int32_t(opts.NumThreads)
	o.max_batch_size = C.int32_t(opts.MaxBatchSize)
	switch {
	case opts.PrefillTokenBudget < 0:
		o.prefill_token_budget = 0
	case opts.PrefillTokenBudget > 0:
		o.prefill_token_budget = C.int32_t(opts.PrefillTokenBudget)
	}
	o.max_queued_requests = C.int32_t(opts.MaxQueuedRequests)
	if opts.TinyModel {
		o.tiny_model = 1
	}
	ptr, err := createWithContext(ctx, "NewEngine", func() (*C.chunkserve_engine_t, error) {
		// Runs to completion even when ctx is done meanwhile, so it owns the C string.
		if opts.ModelPath != "" {
			path := C.CString(opts.ModelPath)
			defer C.free(unsafe.Pointer(path))
			o.model_path = path
		}
		var ptr *C.chunkserve_engine_t
		var cerr *C.chunkserve_error_t
		if st := C.chunkserve_engine_create(&o, &ptr, &cerr); st != 0 {
			return nil, fromC(st, cerr)
		}
		return ptr, nil
	}, func(ptr *C.chunkserve_engine_t) { C.chunkserve_engine_destroy(ptr) })
	if err != nil {
		return nil, err
	}
	e := &Engine{ptr: ptr}
	// A safety net only: an unreachable engine is destroyed, but Close should be called.
	runtime.SetFinalizer(e, (*Engine).Close)
	return e, nil
}

// Close stops the engine (requests in flight end with FinishUnavailable) and frees it. It waits
// for the engine's step thread and is idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ptr != nil {
		C.chunkserve_engine_destroy(e.ptr)
		e.ptr = nil
		runtime.SetFinalizer(e, nil)
	}
	return nil
}

// Shutdown stops the engine without freeing it: ShutdownDrain waits until every submitted
// request has finished, ShutdownAbort ends them now. Submit then fails with ErrUnavailable.
func (e *Engine) Shutdown(mode ShutdownMode) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return ErrClosed
	}
	var cerr *C.chunkserve_error_t
	return fromC(C.chunkserve_engine_shutdown(e.ptr, C.int32_t(mode), &cerr), cerr)
}

// Request is what Submit asks for. Zero values mean the defaults.
type Request struct {
	Prompt       []int32 // token ids in [0, vocab); required
	MaxNewTokens int32   // 0: 16
	StopTokens   []int32 // generating one of these ends the request (FinishStopToken)
	Temperature  float32 // 0: greedy
	TopK         int32   // 0: no limit
	TopP         float32 // 0: 1 (no limit)
	Seed         uint64
	Priority     int32 // higher runs first and is preempted last
	// Timeout ends the request with FinishDeadline after this long; 0: none. A deadline on the
	// context passed to Submit has the same effect.
	Timeout time.Duration
	// Logprobs, when set, makes every token event carry its log-probability and the
	// *Logprobs (0 to 20) most likely tokens at its position (Event.Logprobs).
	Logprobs *int32
}

// Submit validates and enqueues a request and returns its stream. When ctx is cancelled the
// request is cancelled (FinishCancelled); when ctx has a deadline the request gets it
// (FinishDeadline). Errors: ErrInvalidArgument, ErrResourceExhausted, ErrUnavailable, ErrClosed,
// or ctx.Err() if ctx is already done.
func (e *Engine) Submit(ctx context.Context, req Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, free, err := cRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	defer free()

	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return nil, ErrClosed
	}
	var sptr *C.chunkserve_stream_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_engine_submit(e.ptr, &r, &sptr, &cerr); st != 0 {
		return nil, fromC(st, cerr)
	}
	return newStream(ctx, sptr)
}

// cRequest builds the C request options for req. The token arrays go to C memory (cgo forbids
// passing a Go struct holding Go pointers); the caller calls free after the submit call. A
// deadline on ctx becomes the request's deadline when it is sooner than req.Timeout.
func cRequest(ctx context.Context, req Request) (C.chunkserve_request_options_t, func(), error) {
	var r C.chunkserve_request_options_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_request_options_init(&r, C.uint32_t(unsafe.Sizeof(r)), &cerr); st != 0 {
		return r, nil, fromC(st, cerr)
	}
	prompt := cInt32s(req.Prompt)
	stops := cInt32s(req.StopTokens)
	free := func() {
		C.free(unsafe.Pointer(prompt))
		C.free(unsafe.Pointer(stops))
	}
	r.prompt_tokens = prompt
	r.num_prompt_tokens = C.uint64_t(len(req.Prompt))
	r.stop_tokens = stops
	r.num_stop_tokens = C.uint64_t(len(req.StopTokens))
	if req.MaxNewTokens != 0 {
		r.max_new_tokens = C.int32_t(req.MaxNewTokens)
	}
	r.temperature = C.float(req.Temperature)
	r.top_k = C.int32_t(req.TopK)
	if req.TopP != 0 {
		r.top_p = C.float(req.TopP)
	}
	r.seed = C.uint64_t(req.Seed)
	r.priority = C.int32_t(req.Priority)
	if req.Logprobs != nil {
		r.logprobs = C.int32_t(*req.Logprobs)
	}
	timeout := req.Timeout
	if deadline, ok := ctx.Deadline(); ok {
		if left := time.Until(deadline); timeout <= 0 || left < timeout {
			timeout = left
		}
	}
	if timeout > 0 {
		ms := (timeout + time.Millisecond - 1) / time.Millisecond // round up: never 0 (= none)
		r.deadline_ms = C.uint64_t(ms)
	} else if timeout < 0 || req.Timeout < 0 {
		r.deadline_ms = 1 // already past: end at the first step
	}
	return r, free, nil
}

// cInt32s copies s into C memory (nil for an empty slice); the caller frees it.
func cInt32s(s []int32) *C.int32_t {
	if len(s) == 0 {
		return nil
	}
	p := (*C.int32_t)(C.malloc(C.size_t(len(s)) * C.size_t(unsafe.Sizeof(C.int32_t(0)))))
	copy(unsafe.Slice((*int32)(unsafe.Pointer(p)), len(s)), s)
	return p
}

// Cancel cancels the live request with that id (Stream.ID); ErrNotFound when none is live.
func (e *Engine) Cancel(id uint64) error {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return ErrClosed
	}
	var cerr *C.chunkserve_error_t
	return fromC(C.chunkserve_engine_cancel(e.ptr, C.uint64_t(id), &cerr), cerr)
}

// Stats are the engine's counters (since creation) and gauges (at the last step).
type Stats struct {
	RequestsSubmitted uint64
	RequestsFinished  uint64
	PromptTokens      uint64 // prompt tokens of admitted requests
	PrefixHitTokens   uint64 // prompt tokens whose KV came from the prefix cache
	PrefillTokens     uint64
	GeneratedTokens   uint64
	Steps             uint64
	EvictedChunks     uint64
	Preemptions       uint64
	Running           int32
	Queued            int32
	LastBatchSize     int32
	KVBytesUsed       uint64
	KVBytesReferenced uint64
	KVBytesIfUnshared uint64 // what live sequences would use without prefix sharing
	KVBytesCapacity   uint64
	KVBytesPeak       uint64
	ChunksTotal       int32
	ChunksShared      int32
	ChunksRetained    int32
	DecodeTokensPerS  float64
	PrefillTokensPerS float64
}

// Stats returns the engine's statistics; it also works after Shutdown.
func (e *Engine) Stats() (Stats, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return Stats{}, ErrClosed
	}
	var s C.chunkserve_engine_stats_t
	s.struct_size = C.uint32_t(unsafe.Sizeof(s))
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_engine_stats(e.ptr, &s, &cerr); st != 0 {
		return Stats{}, fromC(st, cerr)
	}
	return Stats{
		RequestsSubmitted: uint64(s.requests_submitted),
		RequestsFinished:  uint64(s.requests_finished),
		PromptTokens:      uint64(s.prompt_tokens),
		PrefixHitTokens:   uint64(s.prefix_hit_tokens),
		PrefillTokens:     uint64(s.prefill_tokens),
		GeneratedTokens:   uint64(s.generated_tokens),
		Steps:             uint64(s.steps),
		EvictedChunks:     uint64(s.evicted_chunks),
		Preemptions:       uint64(s.preemptions),
		Running:           int32(s.running),
		Queued:            int32(s.queued),
		LastBatchSize:     int32(s.last_batch_size),
		KVBytesUsed:       uint64(s.kv_bytes_used),
		KVBytesReferenced: uint64(s.kv_bytes_referenced),
		KVBytesIfUnshared: uint64(s.kv_bytes_if_unshared),
		KVBytesCapacity:   uint64(s.kv_bytes_capacity),
		KVBytesPeak:       uint64(s.kv_bytes_peak),
		ChunksTotal:       int32(s.chunks_total),
		ChunksShared:      int32(s.chunks_shared),
		ChunksRetained:    int32(s.chunks_retained),
		DecodeTokensPerS:  float64(s.decode_tokens_per_s),
		PrefillTokensPerS: float64(s.prefill_tokens_per_s),
	}, nil
}

// Info describes the served model.
type Info struct {
	VocabSize        int32 // token ids are in [0, VocabSize)
	MaxContext       int32 // prompt + generated tokens per request
	ChunkSize        int32
	ModelFingerprint uint64
}

// Info returns facts about the served model.
func (e *Engine) Info() (Info, error) {
	e.mu.RLock()
	defer e.mu.RUnlock()
	if e.ptr == nil {
		return Info{}, ErrClosed
	}
	var i C.chunkserve_engine_info_t
	i.struct_size = C.uint32_t(unsafe.Sizeof(i))
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_engine_info(e.ptr, &i, &cerr); st != 0 {
		return Info{}, fromC(st, cerr)
	}
	return Info{
		VocabSize:        int32(i.vocab_size),
		MaxContext:       int32(i.max_context),
		ChunkSize:        int32(i.chunk_size),
		ModelFingerprint: uint64(i.model_fingerprint),
	}, nil
}
