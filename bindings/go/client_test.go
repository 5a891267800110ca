package chunkserve

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// startWorker runs a real chunkserve-worker (CHUNKSERVE_WORKER_BIN, set by ctest) on
// 127.0.0.1 with an ephemeral port and returns its "host:port". The process is killed at cleanup.
// extra: more flags (e.g. TLS).
func startWorker(t *testing.T, extra ...string) string {
	t.Helper()
	bin := os.Getenv("CHUNKSERVE_WORKER_BIN")
	if bin == "" {
		t.Skip("CHUNKSERVE_WORKER_BIN is not set (ctest sets it)")
	}
	args := []string{"--tiny-model", "--listen", "127.0.0.1:0", "--threads", "1", "--kv-cache-mb", "32",
		"--chunk-size", "16"} // as testOptions(), so in-process references compute the same way
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		scanner := bufio.NewScanner(out)
		for scanner.Scan() {
			if line := scanner.Text(); strings.HasPrefix(line, "listening on ") {
				addr <- strings.TrimSpace(strings.TrimPrefix(line, "listening on "))
			}
		}
	}()
	select {
	case a := <-addr:
		return a
	case <-time.After(60 * time.Second):
		t.Fatal("the worker did not print its address within 60 s")
		return ""
	}
}

func dial(t *testing.T, address string) *Client {
	t.Helper()
	c, err := Dial(address, ClientOptions{})
	if err != nil {
		t.Fatalf("Dial(%s): %v", address, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// The test certificates of tests/testing/tls (this package's directory is bindings/go).
const tlsFixtures = "../../tests/testing/tls/"

func TestClientSpeaksTLSWithTheClusterCA(t *testing.T) {
	addr := startWorker(t, "--tls-ca", tlsFixtures+"ca.pem", "--tls-cert", tlsFixtures+"node.pem",
		"--tls-key", tlsFixtures+"node.key")
	client, err := Dial(addr, ClientOptions{TLSCAFile: tlsFixtures + "ca.pem"})
	if err != nil {
		t.Fatalf("Dial with the cluster CA: %v", err)
	}
	defer client.Close()
	s, err := client.Generate(context.Background(), Request{Prompt: prompt(30, 2), MaxNewTokens: 4})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer s.Close()
	if tokens, f, err := s.Collect(); err != nil || len(tokens) != 4 || f.Reason != FinishLength {
		t.Fatalf("over TLS: %v %+v %v", tokens, f, err)
	}
	// A server certificate the given CA did not sign: refused at Dial.
	_, err = Dial(addr, ClientOptions{TLSCAFile: tlsFixtures + "other-ca.pem"})
	var e *Error
	if !errors.As(err, &e) || e.Code != Unauthenticated {
		t.Fatalf("Dial with another CA: %v, want Unauthenticated", err)
	}
}

// TLSCRLFile: a worker whose certificate the CA's list revokes is refused at Dial; the same list
// admits a worker with a valid certificate.
func TestClientRefusesARevokedServerCertificate(t *testing.T) {
	revoked := startWorker(t, "--tls-ca", tlsFixtures+"ca.pem", "--tls-cert",
		tlsFixtures+"revoked.pem", "--tls-key", tlsFixtures+"revoked.key")
	good := startWorker(t, "--tls-ca", tlsFixtures+"ca.pem", "--tls-cert", tlsFixtures+"node.pem",
		"--tls-key", tlsFixtures+"node.key")
	opts := ClientOptions{TLSCAFile: tlsFixtures + "ca.pem", TLSCRLFile: tlsFixtures + "crl.pem"}
	_, err := Dial(revoked, opts)
	var e *Error
	if !errors.As(err, &e) || e.Code != Unauthenticated || !strings.Contains(e.Message, "revoked") {
		t.Fatalf("Dial of a revoked server: %v, want Unauthenticated (certificate revoked)", err)
	}
	client, err := Dial(good, opts)
	if err != nil {
		t.Fatalf("Dial of a valid server with the list: %v", err)
	}
	client.Close()
	_, err = Dial(good, ClientOptions{TLSCAFile: tlsFixtures + "ca.pem",
		TLSCRLFile: tlsFixtures + "other-crl.pem"})
	if !errors.As(err, &e) || e.Code != InvalidArgument {
		t.Fatalf("Dial with another CA's list: %v, want InvalidArgument", err)
	}
}

func TestClientStreamsTheEnginesGreedyTokens(t *testing.T) {
	client := dial(t, startWorker(t))
	req := Request{Prompt: prompt(60, 3), MaxNewTokens: 12}
	s, err := client.Generate(context.Background(), req)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer s.Close()
	if s.ID() != 1 {
		t.Fatalf("first request id = %d, want 1", s.ID())
	}
	var remote []int32
	for tok := range s.Tokens() {
		remote = append(remote, tok)
	}
	f, err := s.Finish()
	if err != nil || f.Reason != FinishLength || f.GeneratedTokens != 12 || f.PromptTokens != 60 {
		t.Fatalf("Finish() = %+v, %v", f, err)
	}
	// The same request in-process, on the same built-in tiny model.
	local, _, err := mustSubmit(t, newTestEngine(t), context.Background(), req).Collect()
	if err != nil {
		t.Fatalf("in-process: %v", err)
	}
	if len(remote) != 12 || !equalTokens(remote, local) {
		t.Fatalf("remote tokens %v, in-process %v", remote, local)
	}
	// A rejection only the server can make (token id >= vocab) ends the stream with its code.
	bad, err := client.Generate(context.Background(), Request{Prompt: []int32{1, 5000}})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer bad.Close()
	if _, _, err := bad.Collect(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("out-of-vocab prompt: %v, want ErrInvalidArgument", err)
	}
}

func TestClientContextCancellationCancelsTheRemoteRequest(t *testing.T) {
	client := dial(t, startWorker(t))
	ctx, cancel := context.WithCancel(context.Background())
	s, err := client.Generate(ctx, Request{Prompt: prompt(20, 4), MaxNewTokens: 4000})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer s.Close()
	if ev, err := s.Recv(); err != nil || ev.Kind != EventToken {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	cancel()
	tokens, f, err := s.Collect()
	if !errors.Is(err, context.Canceled) || f.Reason != FinishCancelled {
		t.Fatalf("Collect() = %d tokens, %+v, %v; want FinishCancelled, context.Canceled",
			len(tokens), f, err)
	}
	if len(tokens) >= 3999 {
		t.Fatalf("%d tokens: the request was not cancelled", len(tokens))
	}
	// The client keeps serving; Cancel by id of a finished request is NotFound.
	if err := client.Cancel(s.ID()); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Cancel(finished) = %v", err)
	}
	s2, err := client.Generate(context.Background(), Request{Prompt: prompt(8, 5), MaxNewTokens: 2})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	defer s2.Close()
	if _, f, err := s2.Collect(); err != nil || f.Reason != FinishLength {
		t.Fatalf("after cancel: %+v, %v", f, err)
	}
	// A closed client is unusable.
	client.Close()
	_, err = client.Generate(context.Background(), Request{Prompt: prompt(4, 1)})
	if err != ErrClosed {
		t.Fatalf("Generate after Close: %v", err)
	}
}

func TestDialAClosedPortIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := l.Addr().String()
	l.Close()
	_, err = Dial(address, ClientOptions{ConnectTimeout: 2 * time.Second})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), address) {
		t.Fatalf("Dial(closed port) = %v, want ErrUnavailable naming %s", err, address)
	}
	if _, err := Dial("no-port", ClientOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Dial(no-port) = %v", err)
	}
	if _, err := Dial("127.0.0.1:0", ClientOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Dial(port 0) = %v", err)
	}
}

func equalTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDialContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if c, err := DialContext(ctx, "127.0.0.1:1", ClientOptions{}); !errors.Is(err, context.Canceled) || c != nil {
		t.Fatalf("done context: %v, %v", c, err)
	}

	// A server that accepts TCP connections and never answers the TLS handshake: connecting
	// blocks in the library until the connect timeout, and DialContext returns with the context.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	conns := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
		}
	}()
	defer func() {
		l.Close()
		for c := range conns {
			c.Close()
		}
	}()
	stalled := ClientOptions{ConnectTimeout: 3 * time.Second, TLSCAFile: tlsFixtures + "ca.pem"}

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	c, err := DialContext(ctx, l.Addr().String(), stalled)
	if !errors.Is(err, context.Canceled) || c != nil || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Fatalf("cancelled during the handshake: %v, %v", c, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("DialContext returned %v after the cancellation, not at once", d)
	}

	// A context deadline shorter than the connect timeout: context.DeadlineExceeded, promptly.
	ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start = time.Now()
	slow := stalled
	slow.ConnectTimeout = time.Minute
	c, err = DialContext(ctx, l.Addr().String(), slow)
	if !errors.Is(err, context.DeadlineExceeded) || c != nil {
		t.Fatalf("context deadline: %v, %v", c, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("DialContext with a 150 ms deadline took %v", d)
	}

	// Cancelled after the library connected but before DialContext returned: the client is closed
	// (the server sees its connection end), not leaked.
	ctx, cancel = context.WithCancel(context.Background())
	returned := make(chan struct{})
	abandoned := make(chan struct{})
	testHooks.created = func() { cancel(); <-returned }
	testHooks.abandoned = func() { close(abandoned) }
	c, err = DialContext(ctx, l.Addr().String(), ClientOptions{KeepaliveInterval: -1})
	testHooks.created, testHooks.abandoned = nil, nil
	close(returned)
	if !errors.Is(err, context.Canceled) || c != nil {
		t.Fatalf("cancelled after connecting: %v, %v", c, err)
	}
	select {
	case <-abandoned:
	case <-time.After(30 * time.Second):
		t.Fatal("the client connected for a cancelled DialContext was not destroyed")
	}
}
