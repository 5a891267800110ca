package chunkserve

/*
#include <stdlib.h>
#include <chunkserve/chunkserve.h>
*/
import "C"

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"
	"unsafe"
)

// ClientOptions configures Dial. The zero value means the defaults.
type ClientOptions struct {
	// ConnectTimeout bounds connecting; 0: 5 s.
	ConnectTimeout time.Duration
	// KeepaliveInterval is how often a health probe keeps an idle connection open on servers
	// with an idle deadline; 0: 5 s; negative: no probes.
	KeepaliveInterval time.Duration
	// TLSCAFile turns on TLS: a PEM file with the CA that signed the server's certificate, whose
	// names must cover the host dialled. Empty: plaintext.
	TLSCAFile string
	// TLSCertFile and TLSKeyFile: an optional certificate this client presents (both or
	// neither; clients need none).
	TLSCertFile, TLSKeyFile string
	// TLSCRLFile: an optional PEM file with the CA's certificate revocation lists (needs
	// TLSCAFile); a server whose certificate they list is refused with Unauthenticated. Re-read
	// when the file changes: an open connection to a newly listed server closes.
	TLSCRLFile string
}

// Client is a connection to a remote chunkserve-router or chunkserve-worker. Generate returns the
// same Stream type as Engine.Submit. Safe for concurrent use. When the connection fails or the
// server goes away, live streams end with FinishUnavailable (ErrUnavailable, retryable); the
// client reconnects by itself (backoff 100 ms doubling to 5 s) and calls to Generate fail with
// ErrUnavailable until it is back. A server with a cluster secret is answered with
// $CHUNKSERVE_CLIENT_TOKEN, else $CHUNKSERVE_CLUSTER_SECRET; without the right key Generate fails
// with Unauthenticated. Close it when done; its streams stay valid and must be closed too.
type Client struct {
	mu  sync.RWMutex // read: calls into the client; write: Close
	ptr *C.chunkserve_client_t
}

// Dial connects to address ("host:port"; the host may be a name or an IPv4/IPv6 address):
// DialContext with context.Background().
func Dial(address string, opts ClientOptions) (*Client, error) {
	return DialContext(context.Background(), address, opts)
}

// DialContext connects to address ("host:port"; the host may be a name or an IPv4/IPv6 address)
// within opts.ConnectTimeout and ctx. A deadline on ctx that is sooner than the connect timeout
// shortens it. Connecting blocks inside the library and cannot be interrupted there, so when ctx
// is done first DialContext returns at once with an error wrapping ctx.Err()
// (errors.Is(err, context.Canceled) or context.DeadlineExceeded), and a connection that still
// completes afterwards is closed in the background: the client never leaks. A ctx that is already
// done returns that error without connecting.
// Other errors: ErrInvalidArgument for a malformed address or options (or TLS files that cannot
// be used), ErrUnavailable when the host does not resolve, refuses the connection or does not
// answer within ConnectTimeout, Unauthenticated when the TLS handshake fails.
func DialContext(ctx context.Context, address string, opts ClientOptions) (*Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, ctxError("Dial "+address, err, nil)
	}
	host, portText, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &Error{Code: InvalidArgument, Message: "Dial: " + err.Error()}
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, &Error{Code: InvalidArgument, Message: "Dial: bad port " + strconv.Quote(portText)}
	}
	var o C.chunkserve_client_options_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_client_options_init(&o, C.uint32_t(unsafe.Sizeof(o)), &cerr); st != 0 {
		return nil, fromC(st, cerr)
	}
	if port < 0 || port > 65535 {
		port = -1 // rejected by the library with its message
	}
	o.port = C.int32_t(port)
	connectTimeout := opts.ConnectTimeout
	if deadline, ok := ctx.Deadline(); ok {
		if connectTimeout <= 0 {
			connectTimeout = 5 * time.Second // the library's default
		}
		if left := time.Until(deadline); left < connectTimeout {
			connectTimeout = left
		}
		if connectTimeout <= 0 {
			return nil, ctxError("Dial "+address, context.DeadlineExceeded, nil)
		}
	}
	if connectTimeout > 0 {
		ms := (connectTimeout + time.Millisecond - 1) / time.Millisecond
		if ms > 1<<31-1 {
			ms = 1<<31 - 1
		}
		o.connect_timeout_ms = C.int32_t(ms)
	}
	switch {
	case opts.KeepaliveInterval < 0:
		o.keepalive_interval_ms = -1
	case opts.KeepaliveInterval > 0:
		ms := (opts.KeepaliveInterval + time.Millisecond - 1) / time.Millisecond
		if ms > 1<<31-1 {
			ms = 1<<31 - 1
		}
		o.keepalive_interval_ms = C.int32_t(ms)
	}
	ptr, err := createWithContext(ctx, "Dial "+address, func() (*C.chunkserve_client_t, error) {
		// Runs to completion even when ctx is done meanwhile, so it owns the C strings.
		chost := C.CString(host)
		defer C.free(unsafe.Pointer(chost))
		o.host = chost
		for _, f := range []struct {
			path string
			dst  **C.char
		}{{opts.TLSCAFile, &o.tls_ca_file}, {opts.TLSCertFile, &o.tls_cert_file},
			{opts.TLSKeyFile, &o.tls_key_file}, {opts.TLSCRLFile, &o.tls_crl_file}} {
			if f.path != "" {
				cpath := C.CString(f.path)
				defer C.free(unsafe.Pointer(cpath))
				*f.dst = cpath
			}
		}
		var ptr *C.chunkserve_client_t
		var cerr *C.chunkserve_error_t
		if st := C.chunkserve_client_create(&o, &ptr, &cerr); st != 0 {
			return nil, fromC(st, cerr)
		}
		return ptr, nil
	}, func(ptr *C.chunkserve_client_t) { C.chunkserve_client_destroy(ptr) })
	if err != nil {
		return nil, err
	}
	c := &Client{ptr: ptr}
	// A safety net only: an unreachable client is destroyed, but Close should be called.
	runtime.SetFinalizer(c, (*Client).Close)
	return c, nil
}

// Close closes the connection (the server cancels this client's requests), stops the client's
// network thread and frees it. Live streams end with FinishUnavailable. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ptr != nil {
		C.chunkserve_client_destroy(c.ptr)
		c.ptr = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

// Generate sends a request and returns its stream, exactly like Engine.Submit: a done ctx
// cancels the request (on the server), a ctx deadline becomes the request's deadline. Checks that
// need the model (token ids below the vocabulary, the context length) and admission happen on the
// server: such a rejection ends the stream with FinishError (or FinishUnavailable) and the
// server's code, e.g. ErrInvalidArgument or ErrResourceExhausted ("overloaded"). Errors returned
// here: ErrInvalidArgument, ErrResourceExhausted (send queue full), ErrUnavailable (not
// connected), ErrClosed, or ctx.Err() if ctx is already done.
func (c *Client) Generate(ctx context.Context, req Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r, free, err := cRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	defer free()

	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ptr == nil {
		return nil, ErrClosed
	}
	var sptr *C.chunkserve_stream_t
	var cerr *C.chunkserve_error_t
	if st := C.chunkserve_client_submit(c.ptr, &r, &sptr, &cerr); st != 0 {
		return nil, fromC(st, cerr)
	}
	return newStream(ctx, sptr)
}

// Cancel cancels this client's live request with that id (Stream.ID); ErrNotFound when none is
// live.
func (c *Client) Cancel(id uint64) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ptr == nil {
		return ErrClosed
	}
	var cerr *C.chunkserve_error_t
	return fromC(C.chunkserve_client_cancel(c.ptr, C.uint64_t(id), &cerr), cerr)
}
