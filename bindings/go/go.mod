module chunkserve.dev/chunkserve

go 1.19
