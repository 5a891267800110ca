package chunkserve

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

// smolLM2Path is SmolLM2-135M-Instruct's GGUF in the model cache that .ci/fetch-models fills
// ($CHUNKSERVE_MODEL_CACHE, else ~/.cache/chunkserve/models), as tests/testing/model_cache.h
// finds it; the test skips, saying where it looked, when the file is absent.
func smolLM2Path(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CHUNKSERVE_MODEL_CACHE")
	if dir == "" {
		home, _ := os.UserHomeDir()
		dir = filepath.Join(home, ".cache", "chunkserve", "models")
	}
	path := filepath.Join(dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s is absent (run .ci/fetch-models, or set CHUNKSERVE_MODEL_CACHE)", path)
	}
	return path
}

func newSmolLM2Engine(t *testing.T) *Engine {
	t.Helper()
	opts := testOptions()
	opts.ModelPath = smolLM2Path(t)
	e, err := NewEngine(opts)
	if err != nil {
		t.Fatalf("NewEngine(%s): %v", opts.ModelPath, err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func TestTextRoundTripsOnSmolLM2(t *testing.T) {
	e := newSmolLM2Engine(t)
	const text = "Hello 👋 world 🌍, 你好，世界！"
	ids, err := e.Tokenize("Hello, world!", false)
	if err != nil {
		t.Fatalf("Tokenize: %v", err)
	}
	if want := []int32{19556, 28, 905, 17}; !equalInt32s(ids, want) { // transformers' ids
		t.Fatalf("Tokenize = %v, want %v", ids, want)
	}
	ids, err = e.Tokenize(text, true)
	if err != nil {
		t.Fatalf("Tokenize: %v", err)
	}
	back, err := e.Detokenize(ids, false)
	if err != nil || back != text {
		t.Fatalf("Detokenize = %q, %v; want %q", back, err, text)
	}

	d, err := e.NewDetokenizer(true)
	if err != nil {
		t.Fatalf("NewDetokenizer: %v", err)
	}
	defer d.Close()
	var streamed strings.Builder
	for _, id := range ids {
		piece, err := d.Push(id)
		if err != nil || !utf8.ValidString(piece) {
			t.Fatalf("Push(%d) = %q, %v", id, piece, err)
		}
		streamed.WriteString(piece)
	}
	rest, err := d.Flush()
	if err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got := streamed.String() + rest; got != text {
		t.Fatalf("streamed %q, want %q", got, text)
	}
	if _, err := d.Push(-1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Push(-1) = %v, want ErrInvalidArgument", err)
	}
	d.Close()
	if _, err := d.Push(1); err != ErrClosed {
		t.Fatalf("Push after Close = %v, want ErrClosed", err)
	}

	prompt, err := e.ApplyChatTemplate([]ChatMessage{{Role: "user", Content: "What is 2+2?"}}, true)
	if err != nil {
		t.Fatalf("ApplyChatTemplate: %v", err)
	}
	if !strings.Contains(prompt, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n") ||
		!strings.HasSuffix(prompt, "<|im_start|>assistant\n") {
		t.Fatalf("ApplyChatTemplate = %q", prompt)
	}
	imEnd, err := e.Tokenize("<|im_end|>", false)
	if err != nil || len(imEnd) != 1 {
		t.Fatalf("Tokenize(<|im_end|>) = %v, %v", imEnd, err)
	}
	eos, err := e.EOSIDs()
	if err != nil || !containsInt32(eos, imEnd[0]) {
		t.Fatalf("EOSIDs() = %v, %v; want it to contain %d", eos, err, imEnd[0])
	}
}

func TestTextWithoutATokenizerIsAClearError(t *testing.T) {
	e := newTestEngine(t)
	_, err := e.Tokenize("hi", false)
	// ctest's tiny model is a folder without tokenizer.json; the built-in one has no path at all.
	if !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrFailedPrecondition) {
		t.Fatalf("Tokenize on the tiny model = %v, want ErrNotFound or ErrFailedPrecondition", err)
	}
	if !strings.Contains(err.Error(), "chunkserve_tokenize") {
		t.Fatalf("error %q does not name the C function", err)
	}
	if _, err2 := e.NewDetokenizer(true); CodeOf(err2) != CodeOf(err) {
		t.Fatalf("NewDetokenizer = %v, want the code of %v", err2, err)
	}
	e.Close()
	if _, err := e.EOSIDs(); err != ErrClosed {
		t.Fatalf("EOSIDs after Close = %v, want ErrClosed", err)
	}
}

func equalInt32s(a, b []int32) bool {
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

func containsInt32(s []int32, v int32) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}
