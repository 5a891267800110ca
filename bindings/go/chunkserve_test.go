package chunkserve

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// CHUNKSERVE_TEST_MODEL_DIR (set by ctest) points at a pre-written tiny model, so engines load in
// milliseconds; without it each engine writes the built-in model to a temporary directory.
func testOptions() EngineOptions {
	dir := os.Getenv("CHUNKSERVE_TEST_MODEL_DIR")
	return EngineOptions{
		ModelPath:    dir,
		TinyModel:    dir == "",
		KVCacheBytes: 8 << 20,
		ChunkSize:    16,
		NumThreads:   1,
	}
}

func newTestEngine(t testing.TB) *Engine {
	t.Helper()
	e, err := NewEngine(testOptions())
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func prompt(n, salt int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((i*131 + salt*977 + 7) % 1024)
	}
	return p
}

func mustSubmit(t testing.TB, e *Engine, ctx context.Context, r Request) *Stream {
	t.Helper()
	s, err := e.Submit(ctx, r)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestVersionMatchesHeader(t *testing.T) {
	if ABIVersion() != HeaderABIVersion {
		t.Fatalf("ABIVersion() = %d, header says %d", ABIVersion(), HeaderABIVersion)
	}
	if v := Version(); strings.Count(v, ".") != 2 {
		t.Fatalf("Version() = %q", v)
	}
	if InvalidArgument.String() != "INVALID_ARGUMENT" || FinishLength.String() != "length" {
		t.Fatalf("names: %v %v", InvalidArgument, FinishLength)
	}
}

func TestGenerateStreamsTokensThenFinish(t *testing.T) {
	e := newTestEngine(t)
	info, err := e.Info()
	if err != nil || info.VocabSize != 1024 || info.ChunkSize != 16 {
		t.Fatalf("Info() = %+v, %v", info, err)
	}
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(20, 1), MaxNewTokens: 6})
	if s.ID() == 0 {
		t.Fatal("stream id is 0")
	}
	var tokens []int32
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if ev.Kind == EventToken {
			if int(ev.Index) != len(tokens) {
				t.Fatalf("index %d, want %d", ev.Index, len(tokens))
			}
			tokens = append(tokens, ev.Token)
			continue
		}
		if ev.Finish.Reason != FinishLength || ev.Finish.GeneratedTokens != 6 || ev.Finish.Err != nil {
			t.Fatalf("finish = %+v", *ev.Finish)
		}
	}
	if len(tokens) != 6 {
		t.Fatalf("got %d tokens", len(tokens))
	}
	if f, err := s.Finish(); err != nil || f.Reason != FinishLength {
		t.Fatalf("Finish() = %+v, %v", f, err)
	}
}

func TestTokensChannelAndSharedPrefix(t *testing.T) {
	e := newTestEngine(t)
	system := prompt(64, 2)
	first := mustSubmit(t, e, context.Background(), Request{Prompt: system, MaxNewTokens: 2})
	if _, _, err := first.Collect(); err != nil {
		t.Fatal(err)
	}
	second := mustSubmit(t, e, context.Background(),
		Request{Prompt: append(append([]int32{}, system...), 5, 6), MaxNewTokens: 4})
	n := 0
	for range second.Tokens() {
		n++
	}
	f, err := second.Finish()
	if err != nil || n != 4 || f.CachedTokens < 48 {
		t.Fatalf("tokens %d, finish %+v, err %v", n, f, err)
	}
	st, err := e.Stats()
	if err != nil || st.RequestsFinished != 2 || st.PrefixHitTokens < 48 {
		t.Fatalf("Stats() = %+v, %v", st, err)
	}
}

func TestConcurrentSubmissionsFromManyGoroutines(t *testing.T) {
	e := newTestEngine(t)
	const goroutines, perGoroutine = 16, 4
	want := make([][]int32, goroutines)
	for g := range want {
		s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(16, g), MaxNewTokens: 5})
		toks, _, err := s.Collect()
		if err != nil {
			t.Fatal(err)
		}
		want[g] = toks
	}
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*perGoroutine)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < perGoroutine; i++ {
				s, err := e.Submit(context.Background(), Request{Prompt: prompt(16, g), MaxNewTokens: 5})
				if err != nil {
					errs <- err
					return
				}
				toks, _, err := s.Collect()
				s.Close()
				if err != nil {
					errs <- err
					return
				}
				if len(toks) != len(want[g]) {
					errs <- errors.New("token count differs")
					return
				}
				for j := range toks {
					if toks[j] != want[g][j] {
						errs <- errors.New("greedy output differs under concurrency")
						return
					}
				}
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestContextCancellationCancelsTheRequest(t *testing.T) {
	e := newTestEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := mustSubmit(t, e, ctx, Request{Prompt: prompt(8, 3), MaxNewTokens: 1000})
	if ev, err := s.Recv(); err != nil || ev.Kind != EventToken {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	cancel()
	toks, f, err := s.Collect()
	if !errors.Is(err, context.Canceled) || f.Reason != FinishCancelled {
		t.Fatalf("Collect: reason %v, err %v", f.Reason, err)
	}
	if len(toks) >= 999 {
		t.Fatalf("cancellation did not stop generation (%d tokens)", len(toks))
	}
}

func TestContextDeadlineBecomesTheRequestDeadline(t *testing.T) {
	e := newTestEngine(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	s := mustSubmit(t, e, ctx, Request{Prompt: prompt(8, 4), MaxNewTokens: 1000})
	_, f, err := s.Collect()
	// Whichever fires first, the engine deadline or the context watcher, the request stops early.
	if f.Reason != FinishDeadline && f.Reason != FinishCancelled {
		t.Fatalf("reason %v", f.Reason)
	}
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrDeadlineExceeded) {
		t.Fatalf("err %v", err)
	}
}

func TestSubmitWithDoneContextFails(t *testing.T) {
	e := newTestEngine(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Submit(ctx, Request{Prompt: prompt(4, 0)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
}

func TestErrorsSurfaceWithCodes(t *testing.T) {
	e := newTestEngine(t)
	_, err := e.Submit(context.Background(), Request{Prompt: []int32{1, 1024}})
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != InvalidArgument || !strings.Contains(ce.Message, "1024") {
		t.Fatalf("bad token: %v", err)
	}
	if !errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrNotFound) || CodeOf(err) != InvalidArgument {
		t.Fatalf("errors.Is / CodeOf on %v", err)
	}
	if _, err := e.Submit(context.Background(), Request{}); CodeOf(err) != InvalidArgument {
		t.Fatalf("empty prompt: %v", err)
	}
	if err := e.Cancel(123456); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Cancel(unknown): %v", err)
	}
	if _, err := NewEngine(EngineOptions{TinyModel: true, ChunkSize: 7}); CodeOf(err) != InvalidArgument {
		t.Fatalf("chunk size 7: %v", err)
	}
	if _, err := NewEngine(EngineOptions{TinyModel: true, GGUFDType: 3}); CodeOf(err) != InvalidArgument {
		t.Fatalf("gguf dtype 3: %v", err)
	}
	// A safetensors model keeps its dtype: GGUFDType is accepted and ignored.
	if e, err := NewEngine(EngineOptions{TinyModel: true, GGUFDType: DTypeBF16}); err != nil {
		t.Fatalf("gguf dtype bf16 with the tiny model: %v", err)
	} else {
		e.Close()
	}
	if _, err := NewEngine(EngineOptions{}); CodeOf(err) != InvalidArgument {
		t.Fatalf("no model: %v (random weights only when asked for)", err)
	}
	if _, err := NewEngine(EngineOptions{ModelPath: "/nonexistent/model"}); err == nil {
		t.Fatal("missing model loaded")
	}
	small := testOptions()
	small.KVCacheBytes = 4 * (64 << 10)
	e2, err := NewEngine(small)
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	if _, err := e2.Submit(context.Background(), Request{Prompt: prompt(200, 0)}); !errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("never fits: %v", err)
	}
}

func TestEngineCancelByID(t *testing.T) {
	e := newTestEngine(t)
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 5), MaxNewTokens: 1000})
	if err := e.Cancel(s.ID()); err != nil {
		t.Fatal(err)
	}
	_, f, err := s.Collect()
	if f.Reason != FinishCancelled || !errors.Is(err, ErrCancelled) {
		t.Fatalf("reason %v err %v", f.Reason, err)
	}
	if err := s.Cancel(); err != nil { // after finish: a no-op
		t.Fatal(err)
	}
}

func TestCloseIsIdempotentAndEndsStreamsUnavailable(t *testing.T) {
	e, err := NewEngine(testOptions())
	if err != nil {
		t.Fatal(err)
	}
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 6), MaxNewTokens: 1000})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	_, f, err := s.Collect()
	if f.Reason != FinishUnavailable || !errors.Is(err, ErrUnavailable) || !errors.Is(f.Err, ErrUnavailable) {
		t.Fatalf("reason %v err %v", f.Reason, err)
	}
	if _, err := e.Submit(context.Background(), Request{Prompt: prompt(4, 0)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close: %v", err)
	}
	if _, err := e.Stats(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Stats after Close: %v", err)
	}
	s.Close()
	s.Close()
	if _, err := s.Recv(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
}

func TestShutdownDrainThenSubmitIsUnavailable(t *testing.T) {
	e := newTestEngine(t)
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 7), MaxNewTokens: 3})
	if err := e.Shutdown(ShutdownDrain); err != nil {
		t.Fatal(err)
	}
	if toks, _, err := s.Collect(); err != nil || len(toks) != 3 {
		t.Fatalf("%d tokens, %v", len(toks), err)
	}
	if _, err := e.Submit(context.Background(), Request{Prompt: prompt(4, 0)}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Submit after Shutdown: %v", err)
	}
}

func TestClosingAStreamWhileAnotherGoroutineReceives(t *testing.T) {
	e := newTestEngine(t)
	s, err := e.Submit(context.Background(), Request{Prompt: prompt(8, 8), MaxNewTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range s.Tokens() {
		}
	}()
	time.Sleep(10 * time.Millisecond)
	s.Close()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Tokens() did not end after Close")
	}
}

// readRSSAnonKiB returns the process' anonymous resident memory (RssAnon), -1 if unknown.
func readRSSAnonKiB() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "RssAnon:") {
			var kib int64
			for _, f := range strings.Fields(line[len("RssAnon:"):]) {
				for _, c := range f {
					if c < '0' || c > '9' {
						return kib
					}
					kib = kib*10 + int64(c-'0')
				}
				return kib
			}
		}
	}
	return -1
}

// leakTunables gives the process a single malloc arena and a fixed mmap threshold. Engines are
// created and destroyed from whichever OS threads the Go scheduler picks, glibc keeps per-thread
// arenas that retain freed KV arenas, and its dynamic mmap threshold moves the 4 MiB KV arenas from
// mmap (returned on free) into the heap (kept): RSS wandered by tens of MiB without any leak. With
// both fixed, freed memory is reused or returned and real growth stands out.
const leakTunables = "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=131072"

// 1,000 engine create/submit/close cycles: anonymous memory and goroutines must not grow. Runs
// itself in a child process with leakTunables. Skipped with -short.
// Without CHUNKSERVE_TEST_MODEL_DIR each engine regenerates the tiny model (~40 ms), so the cycle
// count drops to 100 to keep the test short.
func TestNoLeaksAcrossEngineCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 1,000 engine cycles")
	}
	if !strings.Contains(os.Getenv("GLIBC_TUNABLES"), leakTunables) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestNoLeaksAcrossEngineCycles$", "-test.v")
		cmd.Env = append(os.Environ(), "GLIBC_TUNABLES="+leakTunables)
		out, err := cmd.CombinedOutput()
		t.Logf("child process:\n%s", out)
		if err != nil {
			t.Fatalf("child process: %v", err)
		}
		return
	}
	cycles := 1000
	if os.Getenv("CHUNKSERVE_TEST_MODEL_DIR") == "" {
		cycles = 100
		t.Logf("CHUNKSERVE_TEST_MODEL_DIR unset: %d cycles on the built-in model", cycles)
	}
	opts := testOptions()
	opts.KVCacheBytes = 4 << 20
	cycle := func(i int) {
		e, err := NewEngine(opts)
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.Submit(context.Background(), Request{Prompt: prompt(8, i), MaxNewTokens: 2})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			e.Close()
			s.Close()
		} else {
			s.Close()
			e.Close()
		}
	}
	for i := 0; i < 50; i++ {
		cycle(i)
	}
	runtime.GC()
	goroutines := runtime.NumGoroutine()
	before := readRSSAnonKiB()
	start := time.Now()
	half := cycles / 2
	for i := 0; i < half; i++ {
		cycle(i)
	}
	runtime.GC()
	mid := readRSSAnonKiB()
	for i := half; i < cycles; i++ {
		cycle(i)
	}
	runtime.GC()
	after := readRSSAnonKiB()
	t.Logf("%d cycles in %v; RssAnon %d -> %d -> %d KiB; goroutines %d -> %d", cycles,
		time.Since(start).Round(time.Millisecond), before, mid, after, goroutines,
		runtime.NumGoroutine())
	// A leak grows the heap in both halves of the run; a one-off jump (allocator caches, thread
	// stacks returned late on a loaded machine) does not. 3 MiB per half of 500 cycles catches any
	// leak above about 6 KiB per cycle.
	if before <= 0 || (mid-before > 3*1024 && after-mid > 3*1024) {
		t.Fatalf("RssAnon grew from %d to %d to %d KiB over %d cycles", before, mid, after, cycles)
	}
	if n := runtime.NumGoroutine(); n > goroutines+2 {
		t.Fatalf("goroutines grew from %d to %d", goroutines, n)
	}
}

func TestLogprobsComeWithEveryTokenWhenAsked(t *testing.T) {
	e := newTestEngine(t)
	p := prompt(24, 5)
	want, _, err := mustSubmit(t, e, context.Background(), Request{Prompt: p, MaxNewTokens: 5}).Collect()
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	three := int32(3)
	s := mustSubmit(t, e, context.Background(), Request{Prompt: p, MaxNewTokens: 5, Logprobs: &three})
	var got []int32
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if ev.Kind != EventToken {
			continue
		}
		l := ev.Logprobs
		if l == nil || len(l.Top) != 3 {
			t.Fatalf("token %d: logprobs %+v, want 3 alternatives", ev.Index, l)
		}
		// Greedy: the token is the most likely one and its logprob the first alternative's.
		if l.Top[0].Token != ev.Token || l.Top[0].Logprob != l.Logprob || l.Logprob > 0 ||
			l.Top[1].Logprob > l.Top[0].Logprob || l.Top[2].Logprob > l.Top[1].Logprob {
			t.Fatalf("token %d (%d): inconsistent logprobs %+v", ev.Index, ev.Token, l)
		}
		got = append(got, ev.Token)
	}
	if len(got) != len(want) {
		t.Fatalf("tokens with logprobs %v, without %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("tokens with logprobs %v, without %v", got, want)
		}
	}
	bad := int32(21)
	if _, err := e.Submit(context.Background(), Request{Prompt: p, Logprobs: &bad}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Logprobs 21: err = %v, want ErrInvalidArgument", err)
	}
}
