package chunkserve

import (
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// osThreads counts the process' OS threads (/proc/self/task), -1 if unknown.
func osThreads() int {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return -1
	}
	return len(entries)
}

// 2,000 streams with a goroutine waiting on each at once (half in Recv, half ranging over
// Tokens) park without OS threads: the process stays under 50 threads. Events come from the
// library's stream callback, not from threads blocked in chunkserve_stream_next (which needed one
// thread per waiting stream: 2,000 streams meant more than 2,000 threads).
func TestThousandsOfWaitingStreamsHoldFewThreads(t *testing.T) {
	if _, err := os.Stat("/proc/self/task"); err != nil {
		t.Skip("no /proc/self/task to count threads")
	}
	const streams, maxThreads = 2000, 50
	opts := testOptions()
	opts.MaxBatchSize = 1 // one request decodes, 1,999 wait in the queue with no event to read
	e, err := NewEngine(opts)
	if err != nil {
		t.Fatalf("NewEngine: %v", err)
	}
	defer e.Close()
	start := time.Now()
	threadsBefore := osThreads()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	all := make([]*Stream, streams)
	for i := range all {
		s, err := e.Submit(ctx, Request{Prompt: prompt(8, i), MaxNewTokens: 1000})
		if err != nil {
			t.Fatalf("Submit %d: %v", i, err)
		}
		defer s.Close()
		all[i] = s
	}
	var started, finished sync.WaitGroup
	errs := make(chan error, streams)
	// Every stream ends cancelled, except the few the engine finished (length or stop token)
	// before the cancellation: one decodes at a time, 1,000 tokens each.
	var completed atomic.Int32
	outcome := func(err error) {
		switch {
		case err == nil:
			completed.Add(1)
		case !errors.Is(err, context.Canceled):
			errs <- err
		}
	}
	for i, s := range all {
		started.Add(1)
		finished.Add(1)
		go func(i int, s *Stream) {
			defer finished.Done()
			if i%2 == 0 {
				ch := s.Tokens()
				started.Done()
				for range ch {
				}
				outcome(s.Err())
				return
			}
			started.Done()
			for {
				_, err := s.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- err
					return
				}
			}
			_, err := s.Finish()
			outcome(err)
		}(i, s)
	}
	started.Wait()
	time.Sleep(200 * time.Millisecond) // every reader reaches its wait
	threads := 0
	for i := 0; i < 5; i++ {
		if n := osThreads(); n > threads {
			threads = n
		}
		time.Sleep(20 * time.Millisecond)
	}
	goroutines := runtime.NumGoroutine()
	waiting := time.Since(start)
	cancel() // every stream ends with FinishCancelled -> context.Canceled
	ended := make(chan struct{})
	go func() { finished.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(60 * time.Second):
		t.Fatal("streams did not end within 60 s of the cancellation")
	}
	close(errs)
	for err := range errs {
		t.Errorf("stream outcome %v, want context.Canceled", err)
	}
	if n := completed.Load(); n > streams/100 {
		t.Errorf("%d streams completed before the cancellation; one decodes at a time", n)
	}
	t.Logf("%d streams waiting: %d OS threads (%d before submitting), %d goroutines; "+
		"submitted and parked in %v, all ended %v later", streams, threads, threadsBefore,
		goroutines, waiting.Round(time.Millisecond),
		(time.Since(start) - waiting).Round(time.Millisecond))
	if threads >= maxThreads {
		t.Fatalf("%d OS threads while %d streams wait, want < %d", threads, streams, maxThreads)
	}
}

// A stream whose reader does not read does not hold up the library's thread: other streams on
// the same engine finish, and the unread stream later yields every token, in order, then its
// terminal event.
func TestUnreadStreamNeitherBlocksTheEngineNorLosesTokens(t *testing.T) {
	e := newTestEngine(t)
	const n = 300
	slow := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 20), MaxNewTokens: n})
	fast := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 21), MaxNewTokens: 8})
	if toks, _, err := fast.Collect(); err != nil || len(toks) != 8 {
		t.Fatalf("fast stream: %d tokens, %v", len(toks), err)
	}
	// Wait until the unread stream's request has ended in the engine.
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := e.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.RequestsFinished == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the unread request did not finish: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; i < n; i++ {
		ev, err := slow.Recv()
		if err != nil || ev.Kind != EventToken || int(ev.Index) != i {
			t.Fatalf("event %d: %+v, %v", i, ev, err)
		}
	}
	if ev, err := slow.Recv(); err != nil || ev.Kind != EventFinished || ev.Finish.Reason != FinishLength ||
		ev.Finish.GeneratedTokens != n {
		t.Fatalf("terminal event: %+v, %v", ev, err)
	}
	if _, err := slow.Recv(); err != io.EOF {
		t.Fatalf("after the terminal event: %v, want io.EOF", err)
	}
}

// Several goroutines receiving from one stream get every event exactly once between them.
func TestConcurrentReceiversShareOneStream(t *testing.T) {
	e := newTestEngine(t)
	const n, receivers = 200, 8
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 22), MaxNewTokens: n})
	var mu sync.Mutex
	seen := make(map[int32]int)
	finishes := 0
	var wg sync.WaitGroup
	for r := 0; r < receivers; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := s.Recv()
				if err == io.EOF {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if ev.Kind == EventToken {
					seen[ev.Index]++
				} else {
					finishes++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != n || finishes != 1 {
		t.Fatalf("%d distinct tokens, %d terminal events; want %d and 1", len(seen), finishes, n)
	}
	for i, c := range seen {
		if c != 1 {
			t.Fatalf("token %d received %d times", i, c)
		}
	}
	if f, err := s.Finish(); err != nil || f.Reason != FinishLength {
		t.Fatalf("Finish() = %+v, %v", f, err)
	}
}

// The error that ends a stream is not lost by ranging over Tokens: Err and Finish return it once
// the channel is closed.
func TestTokensThenErrReportsTheErrorThatEndedTheStream(t *testing.T) {
	drain := func(s *Stream) int {
		n := 0
		for range s.Tokens() {
			n++
		}
		return n
	}

	t.Run("normal end", func(t *testing.T) {
		e := newTestEngine(t)
		s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 30), MaxNewTokens: 5})
		if err := s.Err(); err != nil {
			t.Fatalf("Err() before the end = %v", err)
		}
		if n := drain(s); n != 5 {
			t.Fatalf("%d tokens", n)
		}
		if err := s.Err(); err != nil {
			t.Fatalf("Err() = %v", err)
		}
		if f, err := s.Finish(); err != nil || f.Reason != FinishLength {
			t.Fatalf("Finish() = %+v, %v", f, err)
		}
	})

	t.Run("engine closed", func(t *testing.T) {
		e, err := NewEngine(testOptions())
		if err != nil {
			t.Fatal(err)
		}
		s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 31), MaxNewTokens: 1000})
		ch := s.Tokens()
		<-ch
		e.Close()
		for range ch {
		}
		if err := s.Err(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Err() = %v, want ErrUnavailable", err)
		}
		if f, err := s.Finish(); f.Reason != FinishUnavailable || !errors.Is(err, ErrUnavailable) ||
			!errors.Is(f.Err, ErrUnavailable) {
			t.Fatalf("Finish() = %+v, %v", f, err)
		}
	})

	t.Run("context cancelled", func(t *testing.T) {
		e := newTestEngine(t)
		ctx, cancel := context.WithCancel(context.Background())
		s := mustSubmit(t, e, ctx, Request{Prompt: prompt(8, 32), MaxNewTokens: 1000})
		ch := s.Tokens()
		<-ch
		cancel()
		for range ch {
		}
		if err := s.Err(); !errors.Is(err, context.Canceled) {
			t.Fatalf("Err() = %v, want context.Canceled", err)
		}
	})

	t.Run("request deadline", func(t *testing.T) {
		e := newTestEngine(t)
		s := mustSubmit(t, e, context.Background(),
			Request{Prompt: prompt(8, 33), MaxNewTokens: 1000, Timeout: 20 * time.Millisecond})
		if n := drain(s); n >= 1000 {
			t.Fatalf("%d tokens: the deadline did not end the request", n)
		}
		if err := s.Err(); !errors.Is(err, ErrDeadlineExceeded) {
			t.Fatalf("Err() = %v, want ErrDeadlineExceeded", err)
		}
	})

	t.Run("cancelled by id", func(t *testing.T) {
		e := newTestEngine(t)
		s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 34), MaxNewTokens: 1000})
		ch := s.Tokens()
		<-ch
		if err := e.Cancel(s.ID()); err != nil {
			t.Fatal(err)
		}
		for range ch {
		}
		if err := s.Err(); !errors.Is(err, ErrCancelled) {
			t.Fatalf("Err() = %v, want ErrCancelled", err)
		}
	})

	t.Run("stream closed", func(t *testing.T) {
		e := newTestEngine(t)
		s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 35), MaxNewTokens: 1000})
		ch := s.Tokens()
		<-ch
		s.Close()
		for range ch {
		}
		if err := s.Err(); err != ErrClosed {
			t.Fatalf("Err() = %v, want ErrClosed", err)
		}
	})
}

// With Tokens in use, Finish returns when the terminal event arrives, even while tokens wait in
// the channel, and leaves them to it.
func TestFinishWithTokensDoesNotWaitForTheReader(t *testing.T) {
	e := newTestEngine(t)
	const n = 100
	s := mustSubmit(t, e, context.Background(), Request{Prompt: prompt(8, 36), MaxNewTokens: n})
	ch := s.Tokens()
	f, err := s.Finish() // nobody reads ch: more tokens than its buffer are pending
	if err != nil || f.Reason != FinishLength || f.GeneratedTokens != n {
		t.Fatalf("Finish() = %+v, %v", f, err)
	}
	got := 0
	for range ch {
		got++
	}
	if got != n || s.Err() != nil {
		t.Fatalf("%d tokens after Finish, Err() = %v", got, s.Err())
	}
}

func TestNewEngineContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if e, err := NewEngineContext(ctx, testOptions()); !errors.Is(err, context.Canceled) || e != nil {
		t.Fatalf("done context: %v, %v", e, err)
	}

	e, err := NewEngineContext(context.Background(), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err = NewEngineContext(ctx, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Info(); err != nil {
		t.Fatal(err)
	}

	// Cancelled while the library creates the engine: NewEngineContext returns the context's
	// error, and the engine created afterwards is destroyed, not leaked.
	ctx, cancel = context.WithCancel(context.Background())
	returned := make(chan struct{})
	abandoned := make(chan struct{})
	testHooks.created = func() { cancel(); <-returned }
	testHooks.abandoned = func() { close(abandoned) }
	e2, err := NewEngineContext(ctx, testOptions())
	testHooks.created, testHooks.abandoned = nil, nil
	close(returned)
	if !errors.Is(err, context.Canceled) || e2 != nil {
		t.Fatalf("cancelled during create: %v, %v", e2, err)
	}
	select {
	case <-abandoned:
	case <-time.After(30 * time.Second):
		t.Fatal("the engine created for a cancelled NewEngineContext was not destroyed")
	}
}
