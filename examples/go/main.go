// chunkserve from Go: several requests that share a system prompt, streamed token by token.
//
// Creates an engine on the built-in tiny model, submits four requests whose prompts start with
// the same 64-token system prompt from four goroutines, prints their tokens as they arrive, and
// reports how much of the prompts the prefix cache served. Ctrl-C cancels the requests.
//
//	PKG_CONFIG_PATH=<build>/lib/pkgconfig go run .    (or <prefix>/lib/pkgconfig; nothing for /usr/local)
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sync"

	"chunkserve.dev/chunkserve"
)

const (
	requests     = 4
	systemTokens = 64
	maxNewTokens = 12
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fmt.Printf("libchunkserve %s (ABI %d)\n", chunkserve.Version(), chunkserve.ABIVersion())
	// The built-in tiny model (random weights): the example needs no download.
	engine, err := chunkserve.NewEngine(chunkserve.EngineOptions{TinyModel: true, KVCacheBytes: 32 << 20, ChunkSize: 16})
	if err != nil {
		log.Fatal(err)
	}
	defer engine.Close()

	system := make([]int32, systemTokens)
	for i := range system {
		system[i] = int32((i*29 + 3) % 1024)
	}

	var mu sync.Mutex // keeps output lines whole
	var wg sync.WaitGroup
	for r := 0; r < requests; r++ {
		prompt := append(append([]int32{}, system...), int32(500+10*r), int32(501+10*r))
		stream, err := engine.Submit(ctx, chunkserve.Request{
			Prompt: prompt, MaxNewTokens: maxNewTokens, Temperature: 0.7, Seed: uint64(r),
		})
		if err != nil {
			log.Fatal(err)
		}
		wg.Add(1)
		go func(r int, stream *chunkserve.Stream) {
			defer wg.Done()
			defer stream.Close()
			i := 0
			for tok := range stream.Tokens() {
				mu.Lock()
				fmt.Printf("request %d token #%d: %d\n", r, i, tok)
				mu.Unlock()
				i++
			}
			f, err := stream.Finish()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fmt.Printf("request %d failed: %v\n", r, err)
				return
			}
			fmt.Printf("request %d finished (%v): %d prompt tokens, %d from the prefix cache, %d generated\n",
				r, f.Reason, f.PromptTokens, f.CachedTokens, f.GeneratedTokens)
		}(r, stream)
	}
	wg.Wait()

	st, err := engine.Stats()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("engine: %d requests, %d prompt tokens, %d served from the prefix cache, %d generated\n",
		st.RequestsFinished, st.PromptTokens, st.PrefixHitTokens, st.GeneratedTokens)
}
